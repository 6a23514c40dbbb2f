set -o pipefail
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/all.log") 2>&1
timeout 200 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider -k "graphs" 2>&1 | tail -4
. benchmarks/bench_fn.sh
bench staged 1024 dflash,eagle3 128
bench dma 1024 dflash,eagle3 128 DFLASH_KERNEL_STAGING=0
bench staged_b 1024 dflash,eagle3 128
bench dma_b 1024 dflash,eagle3 128 DFLASH_KERNEL_STAGING=0
MODES=dflash,none timeout 150 python benchmarks/step_timeline.py 2>&1 | grep -v Warn | grep -v "^    "
