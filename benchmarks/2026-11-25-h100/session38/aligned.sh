#!/usr/bin/env bash
# Session 38: graph replays (benchmarks/step_profile.py, REPLAYS_ONLY=1), two rounds at CTX 1024 (ctx 8192 beside
# it), of three GEMM sources: `new` (csrc: 8-row tiles ask for a warp's short last batch with the batch before),
# `aligned` (the same, and tile16 cuts K over its warps in whole batches: skinny_gemm_aligned.cu) and `before`
# (skinny_gemm_before.cu). `aligned` landed as csrc/skinny_gemm.cu (comments aside) in 36b941a; `before` was
# 5f4782a's (`git show 5f4782a:csrc/skinny_gemm.cu`); the copies are not kept.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/aligned.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=benchmarks/2026-11-25-h100/session38
cp csrc/skinny_gemm.cu /tmp/skinny_gemm_new.cu
. benchmarks/replays_fn.sh
for round in 1 2; do
  cp /tmp/skinny_gemm_new.cu csrc/skinny_gemm.cu; replays new 1024
  cp $here/skinny_gemm_aligned.cu csrc/skinny_gemm.cu; replays aligned 1024
  cp $here/skinny_gemm_before.cu csrc/skinny_gemm.cu; replays before 1024
done
cp $here/skinny_gemm_aligned.cu csrc/skinny_gemm.cu
timeout 200 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels" 2>&1 | tail -3
cp /tmp/skinny_gemm_new.cu csrc/skinny_gemm.cu
