#!/usr/bin/env bash
# One device call: GPU checks (bf16 vs fp32 CPU, graphs vs eager, lossless with graphs), then the
# synthetic bench for qwen3-4b shapes, all three modes, graphed path. The table is printed last.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest_gpu.log"
for tau in ${TAUS:-6}; do
python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau $tau --draft dflash,eagle3 \
  --max-tokens ${MAX_TOKENS:-256} --json "$OUT/bench_synthetic_tau${tau}.json" 2>&1 | tee "$OUT/bench_tau${tau}.log"
done
