#!/usr/bin/env bash
# Session 40: block_trace.log has the 16-row verify's merge (512 one-warp programs, launched early) piled on 31 SMs,
# 32 an SM, ending 4.48 us after the split, and the RoPE kernel (768) on 35. Each launched only once its predecessor
# has ended (DFLASH_SPAN_MERGE_EARLY=0: the span split lets nothing launch early; DFLASH_ROPE_EARLY=0: the RoPE
# kernel is not PDL-launched), against as built: graph replays and DFlash step walls (STEPS_ONLY), two rounds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/late.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
export REPLAY_LINES="graph replay\|DFlash steps"
for r in 1 2; do
  replays base 1024 STEPS_ONLY=1
  replays merge_late 1024 STEPS_ONLY=1 DFLASH_SPAN_MERGE_EARLY=0
  replays rope_late 1024 STEPS_ONLY=1 DFLASH_ROPE_EARLY=0
  replays both_late 1024 STEPS_ONLY=1 DFLASH_SPAN_MERGE_EARLY=0 DFLASH_ROPE_EARLY=0
done
