#!/usr/bin/env bash
# Session 39: K splits over blocks for the 320-tile products (o and down: 2560 rows, 320 8-row tiles, 2.4 blocks an
# SM) and the 160-tile ones of 16-row spans, in graph replays at ctx 1024 (DFLASH_GEMM_PLANS overrides the plan of
# the shapes it names; plans/*.json).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/plans.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
P=$PWD/benchmarks/2026-11-26-h100/session39/plans
replays base 1024
for f in o_8w2s o_4w2s down_8w2s down_4w2s down_8w3s v16_o_2s v16_down_2s v16_down_4w2s; do
  replays $f 1024 DFLASH_GEMM_PLANS=$P/$f.json
done
replays base 1024
