#!/usr/bin/env bash
# Session 37: graph replays with more of a long decode split's key blocks loaded before its wait
# (attention.EARLY_BLOCKS, 1 as landed), with 4 or 8 warps a split program (attention.SPLIT_WARPS), two rounds.
# EARLY_BLOCKS was a knob of the measured tree only (not landed; on the landed tree the line sets nothing used): the
# kernel's EARLY constexpr was that block count, its early load tl.arange(0, EARLY * BLOCK_S) keys and its loop
# starting at block EARLY. Ran before benchmarks/replays_fn.sh took the replays function out of this script.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/blocks.log") 2>&1
. benchmarks/replays_fn.sh
REPLAY_LINES="graph replay: decode at"
for round in 1 2; do
  replays new 1024
  replays eb2 1024 AB_EARLY_BLOCKS=2
  replays eb4w8 1024 AB_EARLY_BLOCKS=4 AB_SPLIT_WARPS=8
  replays new 512
  replays eb2 512 AB_EARLY_BLOCKS=2
done
