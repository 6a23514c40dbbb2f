#!/usr/bin/env bash
# One device call for prefill graphs: the prefill GPU tests (kernel, graphs against eager) and the graphs'
# correctness tests, prefill_host.py (graph against eager, per run), then the synthetic bench's 2048-token prefill
# with prefill graphs and without (DFLASH_PREFILL_GRAPHS=0), twice each, and the bench at ctx 1024.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1
timeout 300 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "${PYTEST_K:-prefill or graphs_match or lossless}"
timeout 150 python benchmarks/prefill_host.py 2>&1 | grep -v Warn
. "$(dirname "$0")/bench_fn.sh"
for round in 1 2; do
  bench prefill2048_graph_$round 2048 none 8
  bench prefill2048_eager_$round 2048 none 8 DFLASH_PREFILL_GRAPHS=0
done
[ -z "$NO_CTX1024" ] && bench ctx1024 1024 dflash,eagle3 128
