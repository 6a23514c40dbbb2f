#!/usr/bin/env bash
# One device call for the fast path: kernel and graph checks, then the synthetic bench at contexts 1024 and 8192
# (qwen3-4b shapes, all three modes) and a 2048-token prefill. Tables are printed last.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest_gpu.log"
python benchmarks/step_profile.py 2>&1 | tee "$OUT/step_profile.log"  # per-kernel time of one step
for ctx in ${CONTEXTS:-1024 8192}; do
  python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau 6 --draft dflash,eagle3 \
    --synthetic-prompt-len $ctx --max-tokens ${MAX_TOKENS:-128} --json "$OUT/bench_ctx${ctx}_tau6.json" 2>&1 | tee "$OUT/bench_ctx${ctx}.log"
done
python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len 2048 --max-tokens 8 \
  --json "$OUT/bench_prefill2048.json" 2>&1 | tee "$OUT/bench_prefill2048.log"
# The same build without the hand GEMM and programmatic dependent launch: what they bring, side by side.
DFLASH_GEMM=cublas DFLASH_PDL=0 python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau 6 \
  --draft dflash,eagle3 --synthetic-prompt-len 1024 --max-tokens ${MAX_TOKENS:-128} \
  --json "$OUT/bench_ctx1024_tau6_cublas_nopdl.json" 2>&1 | tee "$OUT/bench_ctx1024_cublas_nopdl.log"
