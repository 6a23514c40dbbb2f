#!/usr/bin/env bash
# One device call for the persistent decode step (opt-in, DFLASH_MEGAKERNEL=1): its check against the
# kernel-per-op forward (correctness, replay times at ctx 1024 and 8192, VARIANTS of nvcc flags, a traced launch),
# then the GPU tests (TESTS=0 skips; PYTEST_K selects), then the synthetic bench at ctx 1024 as built and with
# the megakernel (BENCH=0 skips). One log (all.log) plus the bench JSON.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python benchmarks/megakernel_check.py || { echo "megakernel check failed: rc $?"; exit 1; }
[ "${TESTS:-1}" = 1 ] && timeout 300 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider \
  ${PYTEST_K:+-k "$PYTEST_K"}
. "$(dirname "$0")/bench_fn.sh"
if [ "${BENCH:-1}" = 1 ]; then
  bench ctx1024 1024 dflash 128
  bench ctx1024_megakernel 1024 dflash 128 DFLASH_MEGAKERNEL=1
fi
