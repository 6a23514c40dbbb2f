#!/usr/bin/env bash
# Session 38: the split warms o's first 8 MB for decode rows over long windows (the tree as committed next): graph
# replays at CTX 1024 (and 8192), the GPU kernel and graph tests; then what staging a plain step's inputs costs:
# the plain synthetic bench at ctx 8192 and 1024 as built and with the decode graphs' id (and position) staging
# skipped (benchmarks/staging_bound.py: wrong tokens, a timing bound), interleaved.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/staging.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
replays new 1024
replays split_warm_off 1024 DFLASH_SPLIT_WARM_MB=0
timeout 200 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
plain() {  # name ctx [ENV=V...]
  local name=$1 ctx=$2; shift 2
  echo "=== plain bench $name: ctx $ctx $*"
  env "$@" timeout 120 python benchmarks/staging_bound.py bench --model qwen3-4b --synthetic --draft none \
    --synthetic-prompt-len "$ctx" --max-tokens 256 --json "$OUT/plain_${name}_$ctx.json" 2>&1 | grep "│ none"
}
for round in 1 2; do
  plain built 8192
  plain no_ids 8192 STAGING_SKIP=ids
  plain no_ids_pos 8192 STAGING_SKIP=ids,positions
done
plain built 1024
plain no_ids 1024 STAGING_SKIP=ids
