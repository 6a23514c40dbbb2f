#!/usr/bin/env bash
# Session 40, the landed tree (one-warp q/k norm + RoPE programs): the GPU kernel and graph tests, graph replays,
# the synthetic bench at ctx 1024 (twice) and 8192 with both drafters, a 2048-token prefill, then the peers
# side by side on the same random weights (benchmarks/peers.py; z-lab's dflash 0.1.0 carried in .whl/).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
. benchmarks/replays_fn.sh
replays final 1024
. benchmarks/bench_fn.sh
bench final_ctx1024 1024 dflash,eagle3 128
bench final_ctx1024b 1024 dflash,eagle3 128
bench final_ctx8192 8192 dflash,eagle3 128
echo "=== prefill 2048"
timeout 120 python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len 2048 \
  --max-tokens 8 --json "$OUT/bench_final_prefill2048.json" 2>&1 | grep "│ none"
python -m pip install -q --no-index --no-deps --target /tmp/zl .whl/dflash-0.1.0-py3-none-any.whl
PYTHONPATH=/tmp/zl:$PYTHONPATH timeout 300 python benchmarks/peers.py 2>&1 | grep -v "Warn\|Loading weights"
