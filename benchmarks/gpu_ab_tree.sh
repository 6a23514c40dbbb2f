#!/usr/bin/env bash
# One device call: A/B of two source trees, the checkout as built against BASE (a folder holding an older
# dflash_cli/, csrc/ and benchmarks/, e.g. from `git archive`; benchmarks/step_timeline.py needs the
# step_profile.py of its own commit or later): GPU tests on the checkout, then interleaved
# rounds of graph replays (step_profile.py REPLAYS_ONLY) with one synthetic bench each at ctx 1024 in round 1,
# then both trees' step timelines (step_timeline.py). Env: BASE (required), PYTEST_K, ROUNDS (default 2),
# TIMELINE=0 skips the timelines.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "${PYTEST_K:-kernels or graphs}" | tail -5
. "$ROOT/benchmarks/bench_fn.sh"
for round in $(seq "${ROUNDS:-2}"); do
  for tree in base as_built; do
    dir=$ROOT; [ "$tree" = base ] && dir=$ROOT/$BASE
    echo "=== replays $tree (round $round)"
    (cd "$dir" && REPLAYS_ONLY=1 timeout 90 python benchmarks/step_profile.py 2>&1 | grep "graph replay")
    [ "$round" = 1 ] && (cd "$dir" && bench "ctx1024_$tree" 1024 dflash,eagle3 128)
  done
done
if [ "${TIMELINE:-1}" = 1 ]; then
  for tree in base as_built; do
    dir=$ROOT; [ "$tree" = base ] && dir=$ROOT/$BASE
    echo "=== step timeline $tree"
    mkdir -p "$OUT/timeline_$tree"
    (cd "$dir" && OUT=$OUT/timeline_$tree MODES=dflash,none timeout 150 python benchmarks/step_timeline.py 2>&1 \
      | grep -E "^==|mean over|device")
  done
fi
