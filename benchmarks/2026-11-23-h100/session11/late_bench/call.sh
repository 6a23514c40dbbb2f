set -o pipefail
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/all.log") 2>&1
benchp() { local name=$1 ctx=$2; shift 2; echo "=== bench $name ctx $ctx $*"; env "$@" timeout 150 python -m dflash_cli bench --model qwen3-4b --synthetic --draft none --synthetic-prompt-len $ctx --max-tokens 128 --json "$OUT/bench_$name.json" 2>&1 | grep "none\|engine"; }
benchp a8192 8192
benchp nochain8192 8192 DFLASH_DECODE_CHAIN=0
benchp a8192b 8192
benchp nochain8192b 8192 DFLASH_DECODE_CHAIN=0
benchp a4096 4096
benchp nochain4096 4096 DFLASH_DECODE_CHAIN=0
benchp a2048 2048
benchp nochain2048 2048 DFLASH_DECODE_CHAIN=0
