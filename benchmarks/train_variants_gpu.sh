#!/usr/bin/env bash
# Issue 44: recipe variants of the demo preset's drafters trained side by side on one GPU in one device call
# (docs/demo-training.md), each a whole (unpaused) schedule: a variant names its steps so that it ends in time.
# A variant is "STAGE:field=value;..." (STAGE dflash, the default, eagle3 or selector: DFlash 2's candidate selector
# over the shipped DFlash drafter; fields of training/presets.Preset).
# H200 figures (2026-12-05): a DFlash step of 64 rows takes 46 ms alone at 32 anchors a row, 60 ms at 64; an
# EAGLE-3 step 38 ms; two runs at once take about 1.5x as long each. The call ends training by END seconds.
#
#   run(command='VARIANTS="dflash_target_layers=(0,2,3,5,6);dflash_steps=5500|eagle3:eagle3_layers=(1,4,7)"
#       bash benchmarks/train_variants_gpu.sh', timeout_s=600, carry=["benchmarks/carry"])
#
# The distillation data comes from benchmarks/carry/distill.tar.* where carried (a tar of work/distill, gzipped or
# not), or is made first (H200: 190 s, H100: 232 s). Returns run.tar.* with logs/, v1/, v2/, ... (each a training
# folder: training_info.json and work/dflash-b16, eagle3 or dflash2) and, where it was made here, distill.tgz (11 MB:
# the next call's benchmarks/carry/distill.tar.0). $OUT must hold nothing else (a call returns at most 8 files: the
# GPU tests' JSON files in the same call once crowded the results out). Then, here:
# benchmarks/demo_acceptance.py NAME=FOLDER ... (held-out τ and acceptance along the draft), and for a winner the
# target and tokenizer copied in and `--stages block,evaluate` on the CPU (train_demo_gpu.sh's last lines).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CARRY=${CARRY:-benchmarks/carry}
DEVICE=${DEVICE:-cuda}  # a dry run here: DEVICE=cpu END=200
END=${END:-560}  # seconds into the call by which training ends (the call has 600; packing the results follows)
IFS='|' read -r -a VARS <<< "${VARIANTS:?set VARIANTS=\"field=value;...|...\"}"
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"

# One folder with the target, the distillation data and the tokenized corpus; the variants are hard-linked copies.
BASE=/tmp/vbase; mkdir -p "$BASE/work" "$BASE/target"
cp dflash_cli/demo/target/* "$BASE/target/"
python - "$BASE/dflash" <<'EOF'  # the shipped DFlash drafter (demo/dflash2 less its selector), the selector's base
import json, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path("dflash_cli/demo/dflash2"), Path(sys.argv[1])
dst.mkdir(parents=True, exist_ok=True)
tensors = load_file(str(src / "model.safetensors"))
save_file({k: v for k, v in tensors.items() if "_conv." not in k and not k.startswith("candidate_selector.")},
          str(dst / "model.safetensors"), metadata={"format": "pt"})
cfg = json.loads((src / "config.json").read_text())
cfg["architectures"] = ["DFlashDraftModel"]
for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
    cfg["dflash_config"].pop(key)
(dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
EOF
python - "$BASE/training_info.json" <<'EOF'  # the shipped run's record, less what the variants redo
import json, sys
info = json.load(open("dflash_cli/demo/training_info.json"))
for key in ("dflash-b16", "dflash-b8", "eagle3", "block", "evaluate", "selector"):
    info["stages"].pop(key, None)
info.pop("block_choice", None), info.pop("evaluation", None)
json.dump(info, open(sys.argv[1], "w"), indent=2)
EOF
STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
PURELIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if compgen -G "$CARRY/distill.tar.*" > /dev/null; then  # the data carried, or made here and returned
  cat "$CARRY"/distill.tar.* | gzip -dcf | tar -C "$BASE/work" -xf -; STAGE=target; else STAGE=distill; fi
python -m dflash_cli train "$BASE" --preset demo --device "$DEVICE" --data "$STDLIB" --data "$PURELIB" --stages $STAGE \
  2>&1 | tee "$OUT/data.log"

copy() {  # hard links, but the record and the lock file (a lock taken through one link holds them all) are new
  rm -rf "$2"; cp -al "$1" "$2"; rm -f "$2/training_info.json" "$2/work/lock"; cp "$1/training_info.json" "$2/"; }
train() {  # folder, variant, seconds, log
  local stage=dflash fields=$2; [[ $2 == *:* ]] && { stage=${2%%:*}; fields=${2#*:}; }
  python benchmarks/train_variant.py "$fields;block_sizes=(16,)" train "$1" --preset demo --device "$DEVICE" \
    --data "$STDLIB" --data "$PURELIB" --stages "$stage" --time-limit "$3" > "$4" 2>&1
}
LIMIT=$(( END - SECONDS ))  # what is left of the call for training, its start and its export
for i in "${!VARS[@]}"; do
  echo "v$((i + 1)): ${VARS[$i]}, $LIMIT s" | tee -a "$OUT/plan.txt"
  copy "$BASE" "/tmp/v$((i + 1))"
  train "/tmp/v$((i + 1))" "${VARS[$i]}" "$LIMIT" "$OUT/v$((i + 1)).log" &
done
wait
grep -h "dflash-b16\|eagle3\|selector\|paused\|error" "$OUT"/v*.log
# One stream back (at most 8 files of 16 MiB): the logs, the variants, then the distillation data where it was made.
mkdir -p /tmp/logs && mv "$OUT"/* /tmp/logs/
[ $STAGE = distill ] && tar -C "$BASE/work" -czf /tmp/distill.tgz distill
cd /tmp && tar -cf - logs $(ls -d v[0-9]*/training_info.json v[0-9]*/work/dflash-b16/*.json \
  v[0-9]*/work/dflash-b16/*.safetensors v[0-9]*/eagle3 v[0-9]*/dflash2 distill.tgz 2>/dev/null) \
  | split -b 15m -d - "$OUT/run.tar."
ls -la "$OUT"
