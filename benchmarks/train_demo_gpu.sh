#!/usr/bin/env bash
# Retrain the embedded demo's drafters with z-lab's DFlash recipe (issue 44; docs/demo-training.md) on the GPU in
# two or three device calls of at most 9 minutes, each resuming from what the last one left; the block choice,
# the evaluation and the bench then run on a 2-core CPU, the product's setting (the last lines below). The demo's
# target and tokenizer are kept (copied from dflash_cli/demo/target), so the distillation data is the shipped
# target's own output; the shipped EAGLE-3 is kept beside a new one trained on the same data, and the evaluation
# reports all of them.
#
#   CALL=1: data + distillation (65,536 continuations) + EAGLE-3 on them + a 25 s timing of DFlash steps.
#           Returns distill.tar.* (about 27 MB) and run.tar.* (files come back in <= 15 MiB pieces).
#   CALL=2: DFlash at block 16 (5 layers, 5000 steps), then block 8 fine-tuned from it (600 steps). Returns
#           run.tar.* (work/dflash-b16, work/dflash-b8, eagle3, training_info.json).
#   CALL=3: only if CALL=2 paused (training_info.json "paused"): the same, resumed on the still-warm machine.
#
# From the repository root of the session's checkout (nothing under benchmarks/carry is committed):
#   echo /benchmarks/carry/ >> .git/info/exclude
#   run(command="CALL=1 bash benchmarks/train_demo_gpu.sh", timeout_s=600)
#   mkdir -p benchmarks/carry && cp <files_at>/distill.tar.* <files_at>/run.tar.* benchmarks/carry/
#   run(command="CALL=2 bash benchmarks/train_demo_gpu.sh", timeout_s=600, carry=["benchmarks/carry"])
# Then, here (python 3.12's standard library: the same relative paths, so the same held-out files, as the GPU's):
#   W=/tmp/demo; mkdir -p $W && cat <files_at>/run.tar.* | tar -C $W -xf - && cp -r dflash_cli/demo/target $W/
#   cp -r dflash_cli/demo/eagle3 $W/eagle3-shipped
#   taskset -c 0,1 dflash train $W --preset demo --device cpu --data <python3.12 stdlib> --stages block,evaluate
#   (then the selector stage over $W/dflash on the device: train_variants_gpu.sh's selector variants)
#   cp $W/dflash2/* dflash_cli/demo/dflash2/  (and $W/eagle3/* if it beats the shipped one on the same data)
#   taskset -c 0,1 dflash bench --model demo --draft none,dflash,dflash2,eagle3 --device cpu --threads 2
# and copy $W/training_info.json to dflash_cli/demo/. Tree + carry stay under the 64 MiB a call takes:
# 23 MB tracked + 27 MB distillation + run.tar.* at CALL=2.
#
# Every call stops itself (--time-limit, default LIMIT=470 s of training) at a resumable point and packs what it
# has. A stage cut short resumes on a warm machine (the next call within its 30 s idle window); a cold machine
# gets only what came back, and a DFlash checkpoint (51 MB with its optimiser) does not fit the 64 MiB a call
# carries beside the tree: CALL=1's calibrate.log says how many DFlash steps 25 s gave ("paused at N/5000");
# if 5000 + 600 steps do not fit CALL=2's LIMIT, lower presets.DEMO.dflash_steps before CALL=2.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/demo}; mkdir -p "$W/work"
CARRY=${CARRY:-benchmarks/carry}
CALL=${CALL:?set CALL=1, 2 or 3}
PRESET=${PRESET:-demo}; DEVICE=${DEVICE:-cuda}; KEEP_TARGET=${KEEP_TARGET:-1}  # tiny/cpu/0: a dry run
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
python -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' | tee -a "$OUT/gpu.txt"

# What earlier calls returned, and the shipped target (kept) and EAGLE-3 (kept for the comparison).
if [ "$KEEP_TARGET" = 1 ]; then
  [ -f "$W/target/model.safetensors" ] || { mkdir -p "$W/target"; cp dflash_cli/demo/target/* "$W/target/"; }
  [ -f "$W/training_info.json" ] || cp dflash_cli/demo/training_info.json "$W/"  # the target's record, kept
fi
ls $CARRY/distill.tar.* >/dev/null 2>&1 && [ ! -d "$W/work/distill" ] && cat $CARRY/distill.tar.* | gzip -dcf | tar -C "$W/work" -xf -
ls $CARRY/run.tar.* >/dev/null 2>&1 && cat $CARRY/run.tar.* | tar -C "$W" -xf -

STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PURELIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DATA=${DATA:---data $STDLIB --data $PURELIB}
train() {  # recipe variants: benchmarks/train_variants_gpu.sh
  python -m dflash_cli train "$W" --preset "$PRESET" --device "$DEVICE" $DATA \
    --time-limit "${LIMIT:-470}" "$@" 2>&1 \
    | tee -a "$OUT/train-$CALL.log"
}
case $CALL in
  1) train --stages tokenizer,target,distill,eagle3  # tokenizer and target: kept ones are skipped
     # Seconds per DFlash step, on a throwaway copy (hard links): 25 s of training, then the log's step readouts.
     rm -rf /tmp/calib && cp -al "$W" /tmp/calib && rm -rf /tmp/calib/training_info.json
     cp "$W/training_info.json" /tmp/calib/ 2>/dev/null
     python -m dflash_cli train /tmp/calib --preset "$PRESET" --device "$DEVICE" $DATA --stages dflash \
       --time-limit 25 2>&1 | grep -E "dflash|stages" | tee "$OUT/calibrate.log" ;;
  2|3) train --stages dflash ;;
esac

# Back: the distillation data once (pieces under the 16 MiB a returned file may hold), and the run's results.
if [ "$CALL" = 1 ] && [ -d "$W/work/distill" ]; then
  tar -C "$W/work" -cf - distill | split -b 15m -d - "$OUT/distill.tar."
fi
KEEP=$([ "$KEEP_TARGET" = 1 ] || echo target)  # a trained target travels too
tar -C "$W" -cf - $(cd "$W" && ls -d training_info.json eagle3 dflash work/dflash-b* $KEEP 2>/dev/null | grep -v ckpt) \
  | split -b 15m -d - "$OUT/run.tar."
cp "$W/training_info.json" "$OUT/" 2>/dev/null
ls -la "$OUT"
