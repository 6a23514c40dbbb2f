#!/usr/bin/env bash
# Session 40: the 16-row verify's merge costs 4.25 us a layer at ctx 1024 (decode's 1.58): its shape and the
# span split's size, through the existing switches, graph replays at ctx 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/merge_knobs.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for r in 0 1; do
  replays base 1024
  replays elems1024 1024 AB_MERGE_ELEMS=1024
  replays elems512 1024 AB_MERGE_ELEMS=512
  replays mwarps2 1024 AB_MERGE_WARPS=2
  replays spanprog64 1024 AB_SPAN_PROGRAMS=64
  replays spanprog256 1024 AB_SPAN_PROGRAMS=256 DFLASH_SPAN_MIN_SPLIT=64
done
