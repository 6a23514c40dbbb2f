#!/usr/bin/env bash
# One device call for the paths no GPU has run yet (2026-11-28): DFlash 2 drafters and their kernels, sliding-window
# drafter layers, Qwen3.5 hybrid targets (DeltaNet kernels, the rewind fold) with DFlash and MTP drafting. GPU tests
# of those paths, the DeltaNet kernels against the torch path, DFlash 2's draft step against DFlash's, then the
# synthetic bench at forced τ 6: Qwen3-4B with DFlash and DFlash 2, Qwen3.5-4B plain, DFlash and MTP. One log
# (all.log) plus JSON. The product path (fresh `dflash generate` / `chat` processes) is a call of its own:
#   PYTHONUNBUFFERED=1 python benchmarks/product_path.py                # Qwen3-4B: none, dflash, dflash2, eagle3
#   MODEL=qwen3.5-4b CHAT=0 PYTHONUNBUFFERED=1 python benchmarks/product_path.py
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider \
  -k "${PYTEST_K:-dflash2 or hybrid or sliding or sampl}"
timeout 240 python benchmarks/delta_rule_bench.py --json "$OUT/delta_rule.json"
REPLAYS_ONLY=1 timeout 180 python benchmarks/step_profile.py 2>&1 | grep -v Warn
synthetic() {  # name model drafts
  echo "=== bench $1: $2 --draft $3, forced τ 6, ctx 1024"
  timeout 120 python -m dflash_cli bench --model "$2" --synthetic --synthetic-tau 6 --draft "$3" \
    --synthetic-prompt-len 1024 --max-tokens 128 --json "$OUT/bench_$1.json" 2>&1 | tail -9
}
synthetic qwen3 qwen3-4b dflash,dflash2
synthetic qwen35 qwen3.5-4b none,dflash,mtp
