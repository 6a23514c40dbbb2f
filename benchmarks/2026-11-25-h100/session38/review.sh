#!/usr/bin/env bash
# Session 38, after the review: the GPU kernel and graph tests, graph replays at CTX 1024 (and 8192), and
# benchmarks/plain_overhead.py (replaying the generation's own decode graph) at ctx 1024 and 8192.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/review.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/replays_fn.sh
replays reviewed 1024
replays split_warm_off 1024 DFLASH_SPLIT_WARM_MB=0
for ctx in 1024 8192; do CTX=$ctx timeout 200 python benchmarks/plain_overhead.py 2>&1 | grep -v Warn; done
