#!/usr/bin/env bash
# Session 40: one-warp q/k norm + RoPE programs (and the merge under a program cap) in the DFlash step as the bench
# runs it (window 1216: step_profile's STEPS_ONLY walls, medians over 6 generations), three rounds interleaved.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/rope_ab.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
export REPLAY_LINES="graph replay: decode 3\|DFlash"
for r in 0 1 2; do
  replays rope4 1024 STEPS_ONLY=1 DFLASH_ROPE_WARPS=4 DFLASH_MERGE_PROGRAMS=0 DFLASH_ONE_BLOCK_WARPS=4
  replays rope1 1024 STEPS_ONLY=1 DFLASH_ROPE_WARPS=1 DFLASH_MERGE_PROGRAMS=0 DFLASH_ONE_BLOCK_WARPS=4
  replays rope1merge 1024 STEPS_ONLY=1 DFLASH_ROPE_WARPS=1 DFLASH_ONE_BLOCK_WARPS=4
done
