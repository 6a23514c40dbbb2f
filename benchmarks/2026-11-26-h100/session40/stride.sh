#!/usr/bin/env bash
# Session 40: the skinny GEMM reads a row stride (ldw); the GPU kernel tests, then stride_bench.py over row pads.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/stride.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels" 2>&1 | tail -3
timeout 300 python benchmarks/2026-11-26-h100/session40/stride_bench.py 0 8 32 64 128 256 512 0 64 2>&1 | grep -v Warn
