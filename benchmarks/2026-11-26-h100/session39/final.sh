#!/usr/bin/env bash
# Session 39, final tree: the decode graph's spans and gaps in a generation at ctx 8192 (benchmarks/plain_gap.py),
# and the synthetic bench at ctx 1024 and 8192 with both drafters.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CTX=8192 timeout 200 python benchmarks/plain_gap.py 2>&1 | grep -v "Warn\|_warn_once\|spans"
. benchmarks/bench_fn.sh
bench final_ctx1024 1024 dflash,eagle3 128
bench final_ctx8192 8192 dflash,eagle3 128
