#!/usr/bin/env bash
# One device call: the foundation GPU check, then `dflash bench --synthetic` (qwen3-4b shapes, eager path).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau 6 --draft dflash,eagle3 \
  --max-tokens 128 --json "$OUT/bench_synthetic_tau6_eager.json" 2>&1 | tee "$OUT/bench.log"
