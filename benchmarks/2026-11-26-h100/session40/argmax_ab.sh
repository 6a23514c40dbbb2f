#!/usr/bin/env bash
# Session 40: greedy DFlash drafts taken inside the draft's graph (the argmax's two kernels no longer between the
# graphs) against ab_old/ (987d65b): GPU kernel and graph tests on the new tree, then DFlash step walls as the bench
# runs them (step_profile STEPS_ONLY: median over 6 generations), three interleaved rounds, and a bench each.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/argmax_ab.log") 2>&1
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/bench_fn.sh
for r in 1 2 3; do
  for tree in old new; do
    dir=$ROOT; [ "$tree" = old ] && dir=$ROOT/ab_old
    echo "=== $tree (round $r)"
    (cd "$dir" && REPLAYS_ONLY=1 STEPS_ONLY=1 timeout 120 python benchmarks/step_profile.py 2>&1 | grep "DFlash")
  done
done
for tree in old new; do
  dir=$ROOT; [ "$tree" = old ] && dir=$ROOT/ab_old
  (cd "$dir" && bench "argmax_$tree" 1024 dflash 128)
done
