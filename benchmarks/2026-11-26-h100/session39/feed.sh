#!/usr/bin/env bash
# Session 39: a greedy decode step feeds its own next inputs. The GPU kernel and graph tests; generation walls of
# the tree before (ab_old/, git archive of 7eafc4a) and after, alternating, at ctx 8192 and 1024; the synthetic bench.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/feed.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
W=benchmarks/2026-11-26-h100/session39/walls.py
for ctx in 8192 1024; do
  for r in 0 1; do
    (cd ab_old && TREE=before CTX=$ctx ROUNDS=1 timeout 100 python ../$W 2>&1 | grep wall)
    TREE=after CTX=$ctx ROUNDS=1 timeout 100 python $W 2>&1 | grep wall
  done
done
. benchmarks/bench_fn.sh
bench feed_ctx8192 8192 dflash,eagle3 128
bench feed_ctx1024 1024 dflash,eagle3 128
