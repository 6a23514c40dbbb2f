#!/usr/bin/env bash
# Session 38: the L2 warm-ups retuned around the split's warm-up of o at ctx 8192: graph replays at CTX 1024 (and
# 8192), two rounds, of the landed tree and of DFLASH_SPLIT_WARM_MB=6, DFLASH_L2_WARM_MB=2 / 6 (every product's
# warm-up, qkv's of the keys included) and DFLASH_KV_WARM_WINDOW=65536 (qkv warms o, the split nothing).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/knobs.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for round in 1 2; do
  replays landed 1024
  replays split6 1024 DFLASH_SPLIT_WARM_MB=6
  replays l2_2 1024 DFLASH_L2_WARM_MB=2
  replays l2_6 1024 DFLASH_L2_WARM_MB=6
  replays o_from_qkv 1024 DFLASH_KV_WARM_WINDOW=65536
done
