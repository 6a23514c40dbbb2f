#!/usr/bin/env bash
# Session 39, after the final read: one staging function (graphs.stage_step with fill and offset) and the fed-state
# bookkeeping in Graphs._replay. The GPU kernel and graph tests, and the synthetic bench at ctx 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/mend.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/bench_fn.sh
bench mend_ctx1024 1024 dflash 128
