#!/usr/bin/env bash
# Session 38: over windows where the qkv product warms the keys instead of o (longer than 6144 keys), the split
# programs ask L2 for o's first rows once their keys are in (DFLASH_SPLIT_WARM_MB; 0 off). Graph replays
# (benchmarks/step_profile.py, REPLAYS_ONLY=1): CTX 1024 (its ctx 8192 lines are the ones that change), two rounds,
# and CTX 2048 (ctx 16384) once.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/long_warm.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for round in 1 2; do
  replays off 1024 DFLASH_SPLIT_WARM_MB=0
  replays mb4 1024 DFLASH_SPLIT_WARM_MB=4
  replays mb8 1024 DFLASH_SPLIT_WARM_MB=8
  replays mb12 1024 DFLASH_SPLIT_WARM_MB=12
  replays mb20 1024 DFLASH_SPLIT_WARM_MB=20
done
replays off 2048 DFLASH_SPLIT_WARM_MB=0
replays mb8 2048 DFLASH_SPLIT_WARM_MB=8
