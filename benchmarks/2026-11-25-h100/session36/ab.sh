#!/usr/bin/env bash
# Session 36, one device call: graph replays (benchmarks/step_profile.py, REPLAYS_ONLY=1) of the build as it is and of
# each variant in VARIANTS ("name:ENV=V[,ENV=V]" separated by spaces), ROUNDS interleaved rounds; RESOURCES=1 in round 1
# lists each Triton kernel's shared memory and registers (the L1 / shared split each asks for).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/ab.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in $(seq "${ROUNDS:-1}"); do
  for v in "as_built:" $VARIANTS; do
    name=${v%%:*}; envs=${v#*:}
    echo "=== replays $name (round $round): ${envs//,/ }"
    env ${envs//,/ } RESOURCES=$([ "$round" = 1 ] && echo 1 || echo 0) REPLAYS_ONLY=1 timeout 150 \
      python benchmarks/step_profile.py 2>&1 | grep "graph replay\|resources _split\|resources _merge\|Error\|error"
  done
done
