#!/usr/bin/env bash
# Session 37's device call on the landed tree: graph replays (benchmarks/step_profile.py, REPLAYS_ONLY=1) with the
# early first key block of long decode splits (new) and without it (DFLASH_EARLY_KEYS=0), and with attention.PROGRAMS
# = 1024 (128-key decode splits at ctx 8192), two rounds at CTX 1024 (and 8192), one at CTX 512 (and 4096); then the
# synthetic bench at ctx 8192 with and without it.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/final.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
. benchmarks/replays_fn.sh
for round in 1 2; do
  replays new 1024
  replays old 1024 DFLASH_EARLY_KEYS=0
  replays p1024 1024 AB_PROGRAMS=1024
done
replays new 512
replays old 512 DFLASH_EARLY_KEYS=0
. benchmarks/bench_fn.sh
bench ctx8192_new 8192 dflash,eagle3 128
bench ctx8192_old 8192 dflash,eagle3 128 DFLASH_EARLY_KEYS=0
