#!/usr/bin/env bash
# Session 40: the bench at ctx 1024 with the q/k norm + RoPE programs on 4 warps (before) and 1 (landed), on the
# machine of final.log, interleaved.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/rope_bench.log") 2>&1
. benchmarks/bench_fn.sh
bench rope4 1024 dflash 128 DFLASH_ROPE_WARPS=4 | grep "│"
bench rope1 1024 dflash 128 | grep "│"
bench rope4b 1024 dflash 128 DFLASH_ROPE_WARPS=4 | grep "│"
bench rope1b 1024 dflash 128 | grep "│"
