#!/usr/bin/env bash
# Session 39: the 16-row products' plans (warps, unroll; tuned in isolation in session 3) re-swept inside the verify
# and draft graphs, ctx 1024 (DFLASH_GEMM_PLANS; plans/*16_*.json).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/plans16.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
P=$PWD/benchmarks/2026-11-26-h100/session39/plans
replays base 1024
for f in gu16_8w_u2 gu16_4w_u4 gu16_8w_u4 qkv16_8w_u4 qkv16_4w_u2 down16_4w_u4 down16_8w_u2 o16_4w_u4; do
  replays $f 1024 DFLASH_GEMM_PLANS=$P/$f.json
done
replays base 1024
