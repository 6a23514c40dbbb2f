#!/usr/bin/env bash
# One device call (session 35, programs.log): graph replays (step_profile.py REPLAYS_ONLY) with the decode split's
# program target attention.PROGRAMS set before capture: at ctx 8192 (window 8448) 512 gives 256-key splits (4 loop
# steps, pipelined: ~70 KB of shared memory a program), 1024 128-key splits, 2048 64-key splits (one step, 20 KB,
# and the decode chain); ctx 1024 keeps 64-key splits with any of them.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/programs.log") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # programs [ENV=V...]
  local p=$1; shift
  echo "=== PROGRAMS=$p $*"
  env "$@" REPLAYS_ONLY=1 RESOURCES=1 timeout 120 python -c "
import runpy, sys
sys.argv = ['step_profile.py']
import dflash_cli.engine.kernels.attention as a
a.PROGRAMS = $p
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -E "graph replay|resources _split|Error|error"
}
for round in 1 2; do
  run 512
  run 2048
  run 1024
  run 2048 DFLASH_DECODE_CHAIN=0
done
