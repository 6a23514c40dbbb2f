#!/usr/bin/env bash
# One device call: GPU tests, the attention split sweep, the step profile (replays, per-kernel times, whole
# DFlash steps), each kernel's share of a step inside its graph (graph_timeline.py) and a step's work between
# its graphs (step_timeline.py), then the synthetic bench
# at ctx 1024 (as built; with BASELINE also cuBLAS and no PDL) and at ctx 8192, and a 2048-token prefill. One log (all.log) plus JSON.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 360 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"}
[ -n "$SWEEP" ] && timeout 60 python benchmarks/attention_sweep.py
timeout 180 python benchmarks/step_profile.py
timeout 120 python benchmarks/graph_timeline.py 2>&1 | grep -v Warn  # each kernel's share of the step in its graph
# A step between its graphs, op by op (DFlash, plain): what runs outside the graphs and how long the GPU idles.
MODES=${MODES:-dflash,none} timeout 150 python benchmarks/step_timeline.py 2>&1 | grep -v Warn
[ -n "$GEMM_TABLE" ] && timeout 120 python benchmarks/gemm_bench.py --ms 1,8,16 --json "$OUT/gemm.json"
. "$(dirname "$0")/bench_fn.sh"
# The first bench process of a call measured EAGLE-3 lower than later ones (700-782 vs 770-890 tok/s, same
# build; records in commit ad746c8:benchmarks/2026-11-23-h100/): it runs twice and the second is the one to read.
bench ctx1024_first 1024 dflash,eagle3 128
bench ctx1024 1024 dflash,eagle3 128
[ -n "$BASELINE" ] && bench ctx1024_cublas_nopdl 1024 dflash,eagle3 128 DFLASH_GEMM=cublas DFLASH_PDL=0
bench ctx8192 8192 dflash,eagle3 128
bench prefill2048 2048 none 8
