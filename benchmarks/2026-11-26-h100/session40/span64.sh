#!/usr/bin/env bash
# Session 40: the 64-row span split (the 16-row verify, the DFlash draft) takes 112 KB of shared memory, over the
# step's 100 KB carveout. 32-key blocks for it (64 KB at 3 stages, 80 KB at 4), and more span programs now that two
# 32-row programs fit an SM; graph replays at ctx 1024 (with its 8x line), two rounds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/span64.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for r in 1 2; do
  replays base 1024
  replays rows64 1024 AB_SPAN_BLOCK_ROWS=64
  replays rows64_st4 1024 AB_SPAN_BLOCK_ROWS=64 AB_SPAN_STAGES=4
  replays st4 1024 AB_SPAN_STAGES=4
  replays prog256 1024 AB_SPAN_PROGRAMS=256
done
