#!/usr/bin/env bash
# Session 40: the three launch shapes together (merge under a program cap, one-warp q/k norm + RoPE programs,
# 8-warp one-block decode splits) against each taken back and all taken back; ctx 1024 and 2048 (the last window
# of one-block splits); then the bench at ctx 1024 on the new defaults.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/combo.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
OLD="DFLASH_MERGE_PROGRAMS=0 DFLASH_ROPE_WARPS=4 DFLASH_ONE_BLOCK_WARPS=4"
for r in 0 1; do
  replays new 1024
  replays old 1024 $OLD
  replays one4 1024 DFLASH_ONE_BLOCK_WARPS=4
  replays one16 1024 DFLASH_ONE_BLOCK_WARPS=16
done
replays new 2048
replays old 2048 $OLD
. benchmarks/bench_fn.sh
bench new_ctx1024 1024 dflash,eagle3 128
bench old_ctx1024 1024 dflash,eagle3 128 $OLD
