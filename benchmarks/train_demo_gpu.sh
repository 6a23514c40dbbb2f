#!/usr/bin/env bash
# Retrain the embedded demo's drafters with z-lab's DFlash recipe (issue 44; docs/demo-training.md) in three device
# calls of at most 9 minutes, each resuming from what the last one returned. The demo's target and tokenizer are
# kept (copied from dflash_cli/demo/target), so the distillation data is the shipped target's own output; the
# shipped EAGLE-3 is kept beside a new one trained on the same data, and the evaluation reports all of them.
#
#   CALL=1: data + distillation (65,536 continuations) + EAGLE-3 on them + a 25 s timing of DFlash steps.
#           Returns distill.tar.* (about 27 MB) and run.tar.* (files come back in <= 15 MiB pieces).
#   CALL=2: DFlash at block 16 (5 layers, 5000 steps). Returns run.tar.* (with work/dflash-b16).
#   CALL=3: block 8 fine-tuned from it, the block-size choice, the evaluation (CPU, 2 threads), `dflash bench` on
#           the new DFlash pinned to 2 cores. Returns run.tar.* (dflash/, eagle3/, candidates), bench.json and
#           training_info.json.
#
# From the repository root of the session's checkout (nothing under benchmarks/carry is committed):
#   echo /benchmarks/carry/ >> .git/info/exclude
#   run(command="CALL=1 bash benchmarks/train_demo_gpu.sh", timeout_s=600)
#   mkdir -p benchmarks/carry && cp <files_at>/distill.tar.* <files_at>/run.tar.* benchmarks/carry/
#   run(command="CALL=2 bash benchmarks/train_demo_gpu.sh", timeout_s=600, carry=["benchmarks/carry"])
#   rm benchmarks/carry/run.tar.*; cp <files_at>/run.tar.* benchmarks/carry/
#   run(command="CALL=3 bash benchmarks/train_demo_gpu.sh", timeout_s=600, carry=["benchmarks/carry"])
# Then unpack run.tar.* (cat run.tar.* | tar -x) and copy its dflash/ (and eagle3/ if it beats the shipped one on
# the same data) and training_info.json into dflash_cli/demo/. Tree + carry stay under the 64 MiB a call takes:
# 23 MB tracked + 27 MB distillation + 12 MB run.tar.* at CALL=3.
#
# Every call stops itself (--time-limit, default LIMIT=470 s of training) at a resumable point and packs what it
# has. A stage cut short resumes on a warm machine (the next call within its 30 s idle window); a cold machine
# gets only what came back, and a DFlash checkpoint (51 MB with its optimiser) does not fit the 64 MiB a call
# carries beside the tree, so CALL=2 must finish: CALL=1's calibrate.log says how many DFlash steps 25 s gave
# ("paused at N/5000"); 5000 steps must fit CALL=2's LIMIT (lower presets.DEMO.dflash_steps before CALL=2 if not).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/demo}; mkdir -p "$W/work"
CARRY=${CARRY:-benchmarks/carry}
CALL=${CALL:?set CALL=1, 2 or 3}
PRESET=${PRESET:-demo}; DEVICE=${DEVICE:-cuda}; KEEP_TARGET=${KEEP_TARGET:-1}; BENCH=${BENCH:-1}  # tiny/cpu/0/0: a dry run
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
python -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$OUT/gpu.txt"

# What earlier calls returned, and the shipped target (kept) and EAGLE-3 (kept for the comparison).
if [ "$KEEP_TARGET" = 1 ]; then
  [ -f "$W/target/model.safetensors" ] || { mkdir -p "$W/target"; cp dflash_cli/demo/target/* "$W/target/"; }
  [ -d "$W/eagle3-shipped" ] || cp -r dflash_cli/demo/eagle3 "$W/eagle3-shipped"
fi
ls $CARRY/distill.tar.* >/dev/null 2>&1 && [ ! -d "$W/work/distill" ] && cat $CARRY/distill.tar.* | tar -C "$W/work" -xf -
ls $CARRY/run.tar.* >/dev/null 2>&1 && cat $CARRY/run.tar.* | tar -C "$W" -xf -

STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PURELIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DATA=${DATA:---data $STDLIB --data $PURELIB}
train() {
  python -m dflash_cli train "$W" --preset "$PRESET" --device "$DEVICE" $DATA --time-limit "${LIMIT:-470}" "$@" 2>&1 \
    | tee -a "$OUT/train-$CALL.log"
}
case $CALL in
  1) train --stages tokenizer,target,distill,eagle3  # tokenizer and target: kept ones are skipped
     # Seconds per DFlash step, on a throwaway copy (hard links): 25 s of training, then the log's step readouts.
     rm -rf /tmp/calib && cp -al "$W" /tmp/calib && rm -rf /tmp/calib/training_info.json
     cp "$W/training_info.json" /tmp/calib/ 2>/dev/null
     python -m dflash_cli train /tmp/calib --preset "$PRESET" --device "$DEVICE" $DATA --stages dflash \
       --time-limit 25 2>&1 | grep -E "dflash|stages" | tee "$OUT/calibrate.log" ;;
  2) train --stages dflash ;;
  3) train --stages block,evaluate
     if [ "$BENCH" = 1 ] && [ -f "$W/dflash/model.safetensors" ]; then  # the product's figure: bench on 2 cores with the new pair
       cp "$W/dflash/"* dflash_cli/demo/dflash/
       [ -n "$BENCH_EAGLE3_NEW" ] && cp "$W/eagle3/"* dflash_cli/demo/eagle3/
       taskset -c 0,1 python -m dflash_cli bench --model demo --draft none,dflash,eagle3 --device cpu --threads 2 \
         --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
     fi ;;
esac
grep -h "digest" dflash_cli/demo/training_info.json "$W/training_info.json" | tee -a "$OUT/train-$CALL.log"  # same corpus split as the target's?

# Back: the distillation data once (pieces under the 16 MiB a returned file may hold), and the run's results.
if [ "$CALL" = 1 ] && [ -d "$W/work/distill" ]; then
  tar -C "$W/work" -cf - distill | split -b 15m -d - "$OUT/distill.tar."
fi
KEEP=$([ "$KEEP_TARGET" = 1 ] || echo target)  # a trained target travels too
tar -C "$W" -cf - $(cd "$W" && ls -d training_info.json eagle3 dflash work/dflash-b* $KEEP 2>/dev/null | grep -v ckpt) \
  | split -b 15m -d - "$OUT/run.tar."
cp "$W/training_info.json" "$OUT/" 2>/dev/null
ls -la "$OUT"
