#!/usr/bin/env bash
# One device call: graph replays with the step's non-GEMM kernels taken out (benchmarks/ablate.py; two
# interleaved rounds), then our decode attention against FlashInfer's (benchmarks/flashinfer_attention.py, when
# flashinfer imports; carry .gpu, see ../shared/gpu/README.md). Logs and JSON into $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/ablate.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in 1 2; do
  for parts in ${ABLATIONS:-none norms qkrope merge attn norms,qkrope,attn}; do
    [ "$parts" = none ] && parts=
    ABLATE=$parts timeout 120 python benchmarks/ablate.py 2>&1 | grep -E "ablate|Error"
  done
done
python -c "import flashinfer" 2>/dev/null && \
  timeout 240 python benchmarks/flashinfer_attention.py --json "$OUT/flashinfer_attention.json" 2>&1 | grep -v Warn
