set -o pipefail; export PYTHONUNBUFFERED=1; . benchmarks/bench_fn.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
git log --oneline -1 2>/dev/null | tee -a $OUT/gpu.txt
timeout 330 python -m pytest -q -m gpu -s tests/gpu -p no:cacheprovider 2>&1 | grep -v "^$" > $OUT/pytest_gpu.log; tail -3 $OUT/pytest_gpu.log
REPLAYS_ONLY=1 timeout 100 python benchmarks/step_profile.py 2>&1 | grep "graph replay" | tee $OUT/replays.log
bench ctx1024 1024 dflash,eagle3 128 2>&1 | tee $OUT/bench_ctx1024.log
bench ctx8192 8192 dflash,eagle3 128 2>&1 | tee $OUT/bench_ctx8192.log
echo "=== prefill 2048"; timeout 120 python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len 2048 --max-tokens 8 --json $OUT/bench_prefill2048.json 2>&1 | tail -6 | tee $OUT/bench_prefill2048.log
