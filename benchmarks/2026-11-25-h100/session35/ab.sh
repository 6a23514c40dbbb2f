#!/usr/bin/env bash
# One device call (session 35, ab_pointers.log): the CUDA GEMM source of 15a180c (orig, copied beforehand to
# $HERE/orig_skinny_gemm.cu: git show 15a180c:csrc/skinny_gemm.cu) against the checkout's with running_pointers.diff
# applied (new: running weight pointers and the W_TILE layout flag): kernel GPU tests on new, the first tiled_bench
# (W_TILE from the environment; since replaced by tiled_bench.py here) for orig and new at W_TILE 0/16/8, then
# interleaved rounds of graph replays (step_profile.py REPLAYS_ONLY) for orig and new.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
HERE=benchmarks/2026-11-25-h100/session35
cp csrc/skinny_gemm.cu /tmp/new.cu
use() { if [ "$1" = orig ]; then cp $HERE/orig_skinny_gemm.cu csrc/skinny_gemm.cu; else cp /tmp/new.cu csrc/skinny_gemm.cu; fi; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
use new
timeout 200 python -m pytest -q -m gpu -s tests/gpu/test_kernels_gpu.py -p no:cacheprovider -k "skinny or swiglu or norm_and" 2>&1 | tail -3
for v in ${TILED:-orig:0 new:0 new:16 new:8}; do
  use ${v%%:*}; echo "=== tiled_bench ${v}"
  W_TILE=${v#*:} PARTS=${PARTS:-chain alone} timeout 150 python benchmarks/tiled_bench.py 2>&1 | grep -v Warn
done
for round in $(seq "${ROUNDS:-2}"); do
  for src in orig new; do
    use $src; echo "=== replays $src (round $round)"
    REPLAYS_ONLY=1 timeout 120 python benchmarks/step_profile.py 2>&1 | grep "graph replay"
  done
done
use new
