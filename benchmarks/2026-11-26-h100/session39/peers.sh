#!/usr/bin/env bash
# Session 39: dflash against its peers on the same random weights (benchmarks/peers.py): transformers' static-cache
# plain decoding and z-lab's reference DFlash loop (the `dflash` 0.1.0 wheel, carried in .whl/).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/peers.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -m pip install -q --no-index --no-deps --target /tmp/zl .whl/dflash-0.1.0-py3-none-any.whl
PYTHONPATH=/tmp/zl:$PYTHONPATH timeout 500 python benchmarks/peers.py 2>&1 | grep -v "Warn\|Loading weights"
