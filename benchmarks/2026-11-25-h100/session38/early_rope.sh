#!/usr/bin/env bash
# Session 38: an early decode split (EARLY) also loads its norm weights and cos / sin at its row's position before
# its wait, and asks for q together with the new key after it (DFLASH_EARLY_ROPE, on; 0 off); with it, one-block
# splits early too (DFLASH_EARLY_ONE=1). Graph replays (benchmarks/step_profile.py, REPLAYS_ONLY=1), two rounds at
# CTX 1024 (ctx 8192 beside it), one at CTX 512 (ctx 4096); then the GPU kernel tests.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/early_rope.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for round in 1 2; do
  replays rope 1024
  replays no_rope 1024 DFLASH_EARLY_ROPE=0
  replays rope_one 1024 DFLASH_EARLY_ONE=1
done
replays rope 512
replays no_rope 512 DFLASH_EARLY_ROPE=0
timeout 200 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "kernels" 2>&1 | tail -3
