#!/usr/bin/env bash
# Session 39: a DFlash block staged by one kernel into the draft graph's buffers (Graphs.staged, graphs.stage_block).
# The GPU kernel and graph tests, then the synthetic bench (plain, DFlash) at ctx 1024 from the tree before
# (ab_old/: git archive of the fed-step commit) and after, alternating.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/block.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/bench_fn.sh
for r in 0 1; do
  (cd ab_old && bench before_$r 1024 dflash 128)
  bench after_$r 1024 dflash 128
done
