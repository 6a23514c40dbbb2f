#!/usr/bin/env bash
# Session 40, the landed tree: what each kernel adds to a step inside its graph (graph_timeline.py: decode at ctx
# 1024 and 8192, the 16-row verify) and what runs between a DFlash step's graphs (step_timeline.py).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/profile.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 250 python benchmarks/graph_timeline.py 2>&1 | grep -v "Warn\|warn_once"
mkdir -p "$OUT/timeline"
OUT=$OUT/timeline MODES=dflash,none timeout 200 python benchmarks/step_timeline.py 2>&1 | grep -v "Warn\|warn_once"
