#!/usr/bin/env bash
# Session 37: graph replays with more of a long decode split's key blocks loaded before its wait
# (attention.EARLY_BLOCKS, 1 as landed), with 4 or 8 warps a split program (attention.SPLIT_WARPS), two rounds.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/blocks.log") 2>&1
replays() {  # name ctx [ENV=V...]; AB_NAME=V sets attention.NAME before capture
  local name=$1 ctx=$2; shift 2
  echo "=== replays $name ctx $ctx: $*"
  env "$@" CTX=$ctx REPLAYS_ONLY=1 timeout 120 python -c "
import os, runpy, sys
import dflash_cli.engine.kernels.attention as a
for k, v in os.environ.items():
    if k.startswith('AB_'):
        setattr(a, k[3:], int(v))
sys.argv = ['step_profile.py']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep "graph replay: decode at\|Error\|error"
}
for round in 1 2; do
  replays new 1024
  replays eb2 1024 AB_EARLY_BLOCKS=2
  replays eb4w8 1024 AB_EARLY_BLOCKS=4 AB_SPLIT_WARPS=8
  replays new 512
  replays eb2 512 AB_EARLY_BLOCKS=2
done
