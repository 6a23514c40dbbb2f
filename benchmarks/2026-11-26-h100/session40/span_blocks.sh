#!/usr/bin/env bash
# Session 40: 32-key blocks for spans of up to 32 query rows a KV head on the RoPE-kernel path (EAGLE-3's verify past
# 2048 keys) against 64 (DFLASH_SPAN_BLOCK_S=64, as before): graph replays at ctx 1024 (its 8x line: ctx 8192) and
# 512 (ctx 4096), two rounds, the split kernels' resources, then EAGLE-3 benches at ctx 4096 and 8192.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/span_blocks.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
REPLAY_LINES="graph replay\|resources _split" replays new 1024 RESOURCES=1
for r in 1 2; do
  replays old 1024 DFLASH_SPAN_BLOCK_S=64
  [ $r = 2 ] && replays new 1024
  replays old 512 DFLASH_SPAN_BLOCK_S=64
  replays new 512
done
. benchmarks/bench_fn.sh
for ctx in 8192 4096; do
  bench eagle_old_$ctx $ctx eagle3 128 DFLASH_SPAN_BLOCK_S=64 | grep "│"
  bench eagle_new_$ctx $ctx eagle3 128 | grep "│"
done
