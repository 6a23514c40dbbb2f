#!/usr/bin/env bash
# Session 36's closing device call: GPU kernel and graph tests on the new defaults (one carveout for every kernel,
# 2-stage long splits, the chain for every decode split, PDL for spans and long decode splits), graph replays of the
# new defaults against the old (OLD below) and (round 1) without PDL on long decode splits, two rounds, then the synthetic bench
# at ctx 1024 and 8192 for both and a 2048-token prefill on the new defaults.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "kernels or graphs" 2>&1 | tail -4
OLD="DFLASH_CARVEOUT=-1 DFLASH_LONG_CHAIN=0 DFLASH_SPAN_PDL=0 DFLASH_LONG_PDL=0 DFLASH_SPLIT_STAGES=3"
for round in 1 2; do
  for v in "new:" "old:$OLD" $([ $round = 1 ] && echo "no_long_pdl:DFLASH_LONG_PDL=0"); do
    echo "=== replays ${v%%:*} (round $round): ${v#*:}"
    env ${v#*:} REPLAYS_ONLY=1 timeout 120 python benchmarks/step_profile.py 2>&1 | grep "graph replay"
  done
done
. benchmarks/bench_fn.sh
bench ctx1024_new 1024 dflash,eagle3 128
bench ctx8192_new 8192 dflash,eagle3 128
bench ctx1024_old 1024 dflash,eagle3 128 $OLD
echo "=== bench prefill 2048 (new)"
timeout 120 python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len 2048 \
  --max-tokens 8 --json "$OUT/bench_prefill2048.json" 2>&1 | tail -6
bench ctx8192_old 8192 dflash,eagle3 128 $OLD
