#!/usr/bin/env bash
# Session 39: the whole GPU suite on the fed decode step, then graph replays with the argmax's first pass launched
# early (DFLASH_ARGMAX_EARLY_ROWS: rows up to which it is) against not, at ctx 1024 (and 8192), two rounds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/early.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -4
. benchmarks/replays_fn.sh
for r in 0 1; do
  replays off 1024
  replays rows1 1024 DFLASH_ARGMAX_EARLY_ROWS=1
  replays rows17 1024 DFLASH_ARGMAX_EARLY_ROWS=17
done
