#!/usr/bin/env bash
# One device call: the qkv product's L2 warm-up of the layer's keys and values (models/decoder.py KV_WARM_WINDOW)
# against the o projection's rows: graph replays at several contexts for each threshold, then the synthetic bench at
# ctx 8192 with and without. Env: CTXS (step_profile CTX values: decode at CTX and 8 x CTX), WINDOWS ("name:N"),
# BENCH=0 skips the benches. (kv_warm/kv_warm.log ran it with the threshold at 4096, named as_built there.)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/kv_warm.log") 2>&1
. "$(dirname "$0")/bench_fn.sh"
WINDOWS=${WINDOWS:-"default:6144 off:1000000000 from4096:2048"}
for round in 1 2; do
  for ctx in ${CTXS:-512 1024 2048}; do
    for v in $WINDOWS; do
      echo "=== replays ctx $ctx ${v%%:*} (round $round)"
      DFLASH_KV_WARM_WINDOW=${v#*:} CTX=$ctx REPLAYS_ONLY=1 timeout 150 python benchmarks/step_profile.py 2>&1 |
        grep "graph replay: decode"
    done
  done
done
[ "${BENCH:-1}" = 1 ] && for v in default:6144 off:1000000000; do
  bench "ctx8192_${v%%:*}" 8192 dflash,eagle3 128 DFLASH_KV_WARM_WINDOW=${v#*:}
done
