#!/usr/bin/env bash
# Session 40, the final tree (d6fce7c: one-warp RoPE programs, 32-key blocks for long 8-row spans): the GPU kernel
# and graph tests, then the synthetic bench at ctx 1024 and 8192 with both drafters.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final2.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/replays_fn.sh
replays final2 1024
. benchmarks/bench_fn.sh
bench final2_ctx1024 1024 dflash,eagle3 128
bench final2_ctx8192 8192 dflash,eagle3 128
