#!/usr/bin/env bash
# Session 40: combo.log had the decode replay at ctx 1024 (window 2048) 20 us faster with the three launch shapes
# but the plain bench (window 1216) 20 us slower, and the decode replay at ctx 2048 (window 4096) 46 us slower.
# Each shape alone, in plain benches at ctx 1024 and 2048 (interleaved, two rounds) and replays at ctx 2048.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/plain_ab.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/bench_fn.sh
. benchmarks/replays_fn.sh
OLD="DFLASH_MERGE_PROGRAMS=0 DFLASH_ROPE_WARPS=4 DFLASH_ONE_BLOCK_WARPS=4"
MERGE="DFLASH_ONE_BLOCK_WARPS=4"
ONE="DFLASH_MERGE_PROGRAMS=0"
for r in 0 1; do
  for ctx in 1024 2048; do
    bench old_$ctx$r $ctx none 128 $OLD | grep "│ none"
    bench merge_$ctx$r $ctx none 128 $MERGE | grep "│ none"
    bench one_$ctx$r $ctx none 128 $ONE | grep "│ none"
    bench new_$ctx$r $ctx none 128 | grep "│ none"
  done
done
replays old 2048 $OLD
replays merge 2048 $MERGE
replays one 2048 $ONE
