set -o pipefail
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/all.log") 2>&1
timeout 200 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "fresh or attention or graphs" 2>&1 | tail -3
. benchmarks/bench_fn.sh
bench ctx8192 8192 eagle3 128
bench ctx1024 1024 eagle3 128
