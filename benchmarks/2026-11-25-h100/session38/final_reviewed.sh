#!/usr/bin/env bash
# Session 38: the synthetic bench at ctx 1024 and 8192 on the reviewed tree (its GPU tests: review.log).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final_reviewed.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/bench_fn.sh
bench reviewed_ctx1024 1024 dflash,eagle3 128
bench reviewed_ctx8192 8192 dflash,eagle3 128
