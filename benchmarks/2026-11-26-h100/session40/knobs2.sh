#!/usr/bin/env bash
# Session 40: the merge's finer dims under a program cap (landed as the default) against the merge before, and
# more launch shapes: q/k norm + RoPE programs of 1-2 warps, 32-key decode splits, split programs of 2 or 8 warps.
# Graph replays at ctx 1024 (and 8192), two rounds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/knobs2.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for r in 0 1; do
  replays new 1024
  replays old 1024 DFLASH_MERGE_PROGRAMS=0
  replays rope1 1024 DFLASH_ROPE_WARPS=1
  replays rope2 1024 DFLASH_ROPE_WARPS=2
  replays blocks32 1024 AB_BLOCK_S=32
  replays swarps2 1024 AB_SPLIT_WARPS=2
  replays swarps8 1024 AB_SPLIT_WARPS=8
done
