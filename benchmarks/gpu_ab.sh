#!/usr/bin/env bash
# One device call: GPU kernel and graph tests, then graph replays (decode, verify, draft; benchmarks/
# step_profile.py) and the synthetic bench at ctx 1024 for the build as it is and for each switch in
# VARIANTS ("name:ENV=V[,ENV=V]" separated by spaces), then the full step profile and ctx 8192.
# Env: PYTEST_K, GEMM_TABLE (rows for a GEMM table), TUNE (a sweep of the CUDA GEMM's plans); BENCH="name ..." benches only those
# variants (the others get their replays; as_built is the build as it is), CTX8192=0 skips the ctx 8192 bench,
# PROFILE=0 the full step profile, ROUNDS=N sets the rounds of replays (default 2, at least 1; benches run in round 1),
# STEPS=1 adds forced DFlash steps' wall times to each round (step_profile.py STEPS_ONLY), CTXS="N ..." replays at
# those contexts (step_profile.py CTX: decode at N and 8N; default 1024), BENCH_CTX=N benches the variants at ctx N.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/all.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 360 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "${PYTEST_K:-kernels or graphs}"
[ -n "$GEMM_TABLE" ] && timeout 120 python benchmarks/gemm_bench.py --ms "$GEMM_TABLE" --json "$OUT/gemm.json"
# TUNE: sweep the CUDA GEMM's plans and write the fastest per product to $OUT/plans.json (to compare with
# kernels/cuda_gemm.plan).
[ -n "$TUNE" ] && timeout 240 python benchmarks/gemm_bench.py --tune --ms 1,8,16 --json "$OUT/gemm.json" \
  --plans "$OUT/plans.json"
. "$(dirname "$0")/bench_fn.sh"
for round in $(seq "$(( ${ROUNDS:-2} < 1 ? 1 : ${ROUNDS:-2} ))"); do  # interleaved rounds: noise shows as their spread
  for v in "as_built:" $VARIANTS; do
    name=${v%%:*}; envs=${v#*:}
    for ctx in ${CTXS:-1024}; do
      echo "=== replays $name (round $round, ctx $ctx): ${envs//,/ }"
      env ${envs//,/ } CTX=$ctx REPLAYS_ONLY=1 STEPS_ONLY=${STEPS:-0} timeout 150 python benchmarks/step_profile.py \
        2>&1 | grep "graph replay\|wall ms/step"
    done
    [ "$round" = 1 ] && { [ -z "$BENCH" ] || [[ " $BENCH " == *" $name "* ]]; } && \
      bench "ctx${BENCH_CTX:-1024}_$name" "${BENCH_CTX:-1024}" dflash,eagle3 128 ${envs//,/ }
  done
done
[ "${PROFILE:-1}" = 1 ] && timeout 150 python benchmarks/step_profile.py 2>&1 | grep -v Warning
[ "${CTX8192:-1}" = 1 ] && bench ctx8192 8192 dflash,eagle3 128
