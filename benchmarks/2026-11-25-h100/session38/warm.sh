#!/usr/bin/env bash
# Session 38, first device call: the attention's split programs ask L2 for the o projection's rows (past the qkv
# product's 4 MB warm-up) once their keys are in (DFLASH_SPLIT_WARM_MB, default 8; 0 off). Graph replays
# (benchmarks/step_profile.py, REPLAYS_ONLY=1) of each size, two rounds, at CTX 1024 (ctx 8192 beside it), and over
# every window (DFLASH_SPLIT_WARM_WINDOW=65536); then the GPU kernel and graph tests.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/warm.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for round in 1 2; do
  replays off 1024 DFLASH_SPLIT_WARM_MB=0
  replays mb8 1024
  replays mb4 1024 DFLASH_SPLIT_WARM_MB=4
  replays mb16 1024 DFLASH_SPLIT_WARM_MB=16
done
replays mb8_all_windows 1024 DFLASH_SPLIT_WARM_WINDOW=65536
replays mb12 1024 DFLASH_SPLIT_WARM_MB=12
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -4
