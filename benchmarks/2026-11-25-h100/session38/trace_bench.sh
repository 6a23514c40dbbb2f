#!/usr/bin/env bash
# Session 38, on 36b941a (the GEMM's short last batches): the per-block trace of the decode step at ctx 1024 and 8192
# and of the 16-row verify (benchmarks/block_trace.py), then the synthetic bench at ctx 1024 and 8192.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/trace_bench.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CTX=1024 timeout 200 python benchmarks/block_trace.py 2>&1 | grep -v Warning
. benchmarks/bench_fn.sh
bench ctx1024 1024 dflash,eagle3 128
bench ctx8192 8192 dflash,eagle3 128
