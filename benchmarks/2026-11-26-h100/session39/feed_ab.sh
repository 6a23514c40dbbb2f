#!/usr/bin/env bash
# Session 39: the fed decode step against the tree before it (ab_old/: git archive of 7eafc4a's dflash_cli, csrc and
# the two benchmark modules walls.py imports), alternating in one call: generation walls at ctx 8192 and 1024, and
# the synthetic bench (plain and DFlash) at ctx 1024 from each tree.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/feed_ab.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=benchmarks/2026-11-26-h100/session39/walls.py
for ctx in 8192 8192 1024; do
  (cd ab_old && TREE=before CTX=$ctx ROUNDS=1 timeout 100 python ../$W 2>&1 | grep wall)
  TREE=after CTX=$ctx ROUNDS=1 timeout 100 python $W 2>&1 | grep wall
done
. benchmarks/bench_fn.sh
(cd ab_old && OUT=$OUT bench before_ctx1024 1024 dflash 128)
bench after_ctx1024 1024 dflash 128
