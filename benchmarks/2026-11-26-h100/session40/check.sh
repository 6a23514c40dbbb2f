#!/usr/bin/env bash
# Session 40, the issue-5 check in one call on the final tree (965cc16's engine): the whole GPU suite, then the
# synthetic bench at ctx 1024 and 8192 (both drafters) and a 2048-token prefill; the tables last.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git log -1 --format='tree %h %s' 2>/dev/null
timeout 330 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -4
. benchmarks/bench_fn.sh
bench check_ctx1024 1024 dflash,eagle3 128
bench check_ctx8192 8192 dflash,eagle3 128
echo "=== prefill 2048"
timeout 120 python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len 2048 \
  --max-tokens 8 --json "$OUT/bench_check_prefill2048.json" 2>&1 | tail -8
