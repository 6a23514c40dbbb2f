#!/usr/bin/env bash
# One device call: GPU tests, the GEMM table, then the synthetic bench (ctx 1024, tau 6) under each GEMM/PDL choice.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
[ -n "$TESTS" ] && python -m pytest -q -m gpu -x tests/gpu -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -15 | tee "$OUT/pytest_gpu.log"
[ -n "$GEMM_TABLE" ] && python benchmarks/gemm_bench.py --ms 1,16 --json "$OUT/gemm.json" 2>&1 | tee "$OUT/gemm.log"
# a variant is GEMM:PDL:MAX_M (DFLASH_GEMM, DFLASH_PDL, DFLASH_GEMM_MAX_M)
for v in ${VARIANTS:-cublas:0:16 auto:1:16 auto:1:1}; do
  IFS=: read -r g p m <<< "$v"
  echo "=== DFLASH_GEMM=$g DFLASH_PDL=$p DFLASH_GEMM_MAX_M=$m"
  DFLASH_GEMM=$g DFLASH_PDL=$p DFLASH_GEMM_MAX_M=$m python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau 6 \
    --draft ${DRAFTS:-dflash,eagle3} --synthetic-prompt-len ${CTX:-1024} --max-tokens 128 \
    --json "$OUT/bench_${g}_pdl${p}_m${m}_ctx${CTX:-1024}.json" 2>&1 | tail -9 | tee "$OUT/bench_${g}_pdl${p}_m${m}.log"
done
