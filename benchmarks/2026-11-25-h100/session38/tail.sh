#!/usr/bin/env bash
# Session 38: a warp's last batch of fewer than U chunks (down_proj: 38 chunks a warp at 8 warps) asked for with the
# batch before it, instead of a loop of single chunks after the batches. Graph replays (benchmarks/step_profile.py,
# REPLAYS_ONLY=1) of the new GEMM source and of the one before (skinny_gemm_before.cu swapped in), two rounds at
# CTX 1024 (ctx 8192 beside it); then the GPU kernel and graph tests on the new source. skinny_gemm_before.cu was
# 5f4782a's csrc/skinny_gemm.cu. The new source here also replaced tile16's loop of single chunks by one batch of
# the last chunks, loaded together after the loop (not kept: verify 16 rows lost 40 us with it).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/tail.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=benchmarks/2026-11-25-h100/session38
cp csrc/skinny_gemm.cu /tmp/skinny_gemm_new.cu
. benchmarks/replays_fn.sh
for round in 1 2; do
  cp /tmp/skinny_gemm_new.cu csrc/skinny_gemm.cu; replays new 1024
  cp $here/skinny_gemm_before.cu csrc/skinny_gemm.cu; replays before 1024
done
cp /tmp/skinny_gemm_new.cu csrc/skinny_gemm.cu
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -4
