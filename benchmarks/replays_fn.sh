# Sourced by the one-call GPU scripts: graph replays of benchmarks/step_profile.py (REPLAYS_ONLY=1) at a CTX, with
# environment switches; AB_NAME=V among them sets dflash_cli.engine.kernels.attention.NAME = V (an int) before
# capture. REPLAY_LINES: the lines kept (grep pattern; all replay lines unless set).
replays() {  # name ctx [ENV=V...]
  local name=$1 ctx=$2; shift 2
  echo "=== replays $name ctx $ctx: $*"
  env "$@" CTX=$ctx REPLAYS_ONLY=1 timeout 120 python -c "
import os, runpy, sys
import dflash_cli.engine.kernels.attention as a
for k, v in os.environ.items():
    if k.startswith('AB_'):
        setattr(a, k[3:], int(v))
sys.argv = ['step_profile.py']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep "${REPLAY_LINES:-graph replay}\|Error\|error"
}
