#!/usr/bin/env bash
# Session 38, last device call: one staging kernel and one timing mark a plain step. The GPU kernel and graph
# tests, benchmarks/plain_overhead.py at ctx 1024 and 8192, and the synthetic bench at ctx 8192 and 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/driver.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
for ctx in 1024 8192; do CTX=$ctx timeout 200 python benchmarks/plain_overhead.py 2>&1 | grep -v Warn; done
. benchmarks/bench_fn.sh
bench driver_ctx8192 8192 dflash,eagle3 128
bench driver_ctx1024 1024 dflash,eagle3 128
