#!/usr/bin/env bash
# Session 36, last call: the 16-row verify at ctx 8192 (the bench's DFlash verify there came out 4.12 against 4.02
# ms a step with the new defaults): replays of 64-row spans with 3 stages (the default after this call), with 2
# (DFLASH_TWO_STAGE_ROWS=64, final.sh's "new"), without span PDL, and the old defaults; then the bench at ctx 8192.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/spans8192.log") 2>&1
OLD="DFLASH_CARVEOUT=-1 DFLASH_LONG_CHAIN=0 DFLASH_SPAN_PDL=0 DFLASH_LONG_PDL=0 DFLASH_SPLIT_STAGES=3"
for round in 1 2; do
  for v in "rows32:" "rows64:DFLASH_TWO_STAGE_ROWS=64" "rows32_nospanpdl:DFLASH_SPAN_PDL=0" "old:$OLD"; do
    echo "=== replays ${v%%:*} (round $round): ${v#*:}"
    env ${v#*:} REPLAYS_ONLY=1 timeout 120 python benchmarks/step_profile.py 2>&1 | grep "graph replay"
  done
done
. benchmarks/bench_fn.sh
bench ctx8192_rows32 8192 dflash,eagle3 128
