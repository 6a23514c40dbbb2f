#!/usr/bin/env bash
# Session 39, last call on the final tree: the GPU kernel and graph tests, then benchmarks/peers.py (our prefill
# graph now captured before the timed run) with z-lab's dflash 0.1.0 carried in .whl/.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/last.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -3
python -m pip install -q --no-index --no-deps --target /tmp/zl .whl/dflash-0.1.0-py3-none-any.whl
PYTHONPATH=/tmp/zl:$PYTHONPATH timeout 300 python benchmarks/peers.py 2>&1 | grep -v "Warn\|Loading weights"
