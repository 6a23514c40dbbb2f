# Sourced by the one-call GPU scripts: one synthetic `dflash bench` run (Qwen3-4B shapes, forced τ 6), the
# table in the log and its JSON at $OUT/bench_NAME.json.
bench() {  # name ctx drafts max_tokens [ENV=V...]
  local name=$1 ctx=$2 drafts=$3 tokens=$4; shift 4
  echo "=== bench $name: ctx $ctx $*"
  env "$@" timeout 150 python -m dflash_cli bench --model qwen3-4b --synthetic --synthetic-tau 6 --draft "$drafts" \
    --synthetic-prompt-len "$ctx" --max-tokens "$tokens" --json "$OUT/bench_$name.json" 2>&1 | tail -9
}
