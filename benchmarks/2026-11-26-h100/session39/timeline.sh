#!/usr/bin/env bash
# Session 39: where a DFlash step's time goes outside its graphs (benchmarks/step_timeline.py, ctx 1024), and the
# synthetic bench at ctx 8192 (plain) on the fed decode step.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/timeline.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
MODES=dflash,none CTX=1024 timeout 200 python benchmarks/step_timeline.py 2>&1 | grep -v Warn
. benchmarks/bench_fn.sh
bench timeline_ctx8192 8192 dflash 128
