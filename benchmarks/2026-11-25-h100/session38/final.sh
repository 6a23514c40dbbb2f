#!/usr/bin/env bash
# Session 38's closing device call on the landed tree: the GPU kernel and graph tests, graph replays at CTX 1024 (and
# 8192) with the split's warm-up of o on and off, then the synthetic bench at ctx 1024 and 8192 and the 2048-token
# prefill.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/replays_fn.sh
replays landed 1024
replays split_warm_off 1024 DFLASH_SPLIT_WARM_MB=0
. benchmarks/bench_fn.sh
bench ctx1024 1024 dflash,eagle3 128
bench ctx8192 8192 dflash,eagle3 128
bench prefill2048 2048 none 8
