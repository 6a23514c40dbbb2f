#!/usr/bin/env bash
# Session 39: the greedy verdict's cost in a step's graph (tail.py), and each kernel's marginal time
# (benchmarks/graph_timeline.py) at ctx 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/tail.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python benchmarks/2026-11-26-h100/session39/tail.py 2>&1 | grep round
timeout 250 python benchmarks/graph_timeline.py 2>&1 | grep -v Warn
