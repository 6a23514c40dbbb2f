#!/usr/bin/env bash
# Session 37's closing device call on the landed tree: the GPU kernel and graph tests, then the synthetic bench at
# ctx 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -4
. benchmarks/bench_fn.sh
bench ctx1024 1024 dflash,eagle3 128
