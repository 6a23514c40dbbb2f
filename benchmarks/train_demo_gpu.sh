#!/usr/bin/env bash
# One device call: train the embedded demo pair (`dflash train --preset demo`) on this machine's Python
# source (standard library + installed packages). Rerunning with the returned distill.pt / tars unpacked
# into $W resumes at the first unfinished stage.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/demo}; mkdir -p "$W/work"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for f in target.tar drafters.tar; do [ -f "benchmarks/carry/$f" ] && tar -C "$W" -xf "benchmarks/carry/$f"; done
[ -f benchmarks/carry/distill.pt ] && cp benchmarks/carry/distill.pt "$W/work/"
STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PURELIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$OUT/gpu.txt"
timeout ${BUDGET:-540} python -m dflash_cli train "$W" --preset demo --device cuda --data "$STDLIB" --data "$PURELIB" \
  ${STAGES:+--stages "$STAGES"} 2>&1 | tee "$OUT/train.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/train.log"
[ -d "$W/target" ] && tar -C "$W" -cf "$OUT/target.tar" target
tar -C "$W" -cf "$OUT/drafters.tar" $(cd "$W" && ls -d dflash eagle3 training_info.json 2>/dev/null) 2>/dev/null
[ -f "$W/work/distill.pt" ] && cp "$W/work/distill.pt" "$OUT/"
ls -la "$OUT"
