#!/usr/bin/env bash
# One device call for the newer paths: DFlash 2 drafters and their kernels, sliding-window drafter layers, Qwen3.5
# hybrid targets (DeltaNet kernels, the rewind fold) with DFlash and MTP drafting. The figures the issues ask for come
# first (the synthetic bench at forced τ 6: Qwen3-4B with DFlash and DFlash 2, Qwen3.5-4B plain, DFlash and MTP; the
# DeltaNet kernels and the rewind's share of a verify; DFlash 2's draft step against DFlash's; the hybrid's decode
# graph), then the GPU tests of those paths with what is left of the call (DEADLINE seconds, default 570). One log
# (all.log) plus JSON. The product path (fresh `dflash generate` / `chat` processes) is a call of its own:
#   PYTHONUNBUFFERED=1 python benchmarks/product_path.py                # Qwen3-4B: none, dflash, dflash2, eagle3
#   MODEL=qwen3.5-4b CHAT=0 PYTHONUNBUFFERED=1 python benchmarks/product_path.py
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-570}
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
left() { echo $(( DEADLINE - SECONDS < $1 ? DEADLINE - SECONDS : $1 )); }  # a step's limit: its own or the rest
synthetic() {  # name model drafts
  echo "=== bench $1: $2 --draft $3, forced τ 6, ctx 1024 ($SECONDS s)"
  timeout "$(left 150)" python -m dflash_cli bench --model "$2" --synthetic --synthetic-tau 6 --draft "$3" \
    --synthetic-prompt-len 1024 --max-tokens 128 --json "$OUT/bench_$1.json" 2>&1 | tail -9
}
synthetic qwen3 qwen3-4b dflash,dflash2
synthetic qwen35 qwen3.5-4b none,dflash,mtp
echo "=== DeltaNet kernels and the rewind ($SECONDS s)"
timeout "$(left 150)" python benchmarks/delta_rule_bench.py --json "$OUT/delta_rule.json"
echo "=== step replays ($SECONDS s)"
REPLAYS_ONLY=1 timeout "$(left 150)" python benchmarks/step_profile.py 2>&1 | grep -v Warn
echo "=== Qwen3.5-4B decode graph ($SECONDS s)"
MODEL=qwen3.5-4b timeout "$(left 120)" python benchmarks/graph_timeline.py 2>&1 | head -40
echo "=== GPU tests ($SECONDS s)"
(( DEADLINE - SECONDS > 30 )) && timeout "$(left 240)" python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider \
  -k "${PYTEST_K:-dflash2 or hybrid or sliding or sampl}"
echo "=== done ($SECONDS s)"
