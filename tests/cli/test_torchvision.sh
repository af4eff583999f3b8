#!/usr/bin/env bash
# torchvision's layout (issue 32): a --save of resnet18-tv, resnet34 and resnet50, with either stem
# and with --zero-init-residual, loads into torchvision's own model with
# load_state_dict(strict=True) and, evaluated there in eval mode, gives dptrain's test loss and
# accuracy (tests/cli/torchvision_check.py). Needs Debian's python3-torchvision (tests/run.sh
# installs it); skips (77) where no python3 imports it.
# Usage: test_torchvision.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
py=""
for p in python3 /usr/bin/python3; do  # a pyenv python3 may shadow Debian's, which has torch
  if command -v "$p" > /dev/null && "$p" -c 'import numpy, torch, torchvision' 2> /dev/null; then py=$p; break; fi
done
if [[ -z $py ]]; then echo "skip: no python3 here imports torchvision (apt-get install python3-torchvision)"; exit 77; fi
cd "$tmp" || exit 1
make_data() { python3 "$lib_dir/../data/make_data.py" "$@" > /dev/null || fail "make_data.py $*"; }
# Small images keep the CIFAR stem's full-resolution stages cheap (2 cores).
make_data d16 --format npy --npy-4d --train 16 --test 16 --rows 16 --cols 16 --channels 3 --classes 5 --seed 6 --learnable
make_data d32 --format npy --npy-4d --train 16 --test 16 --rows 32 --cols 32 --channels 3 --classes 5 --seed 7 --learnable
make_data d64 --format npy --npy-4d --train 16 --test 16 --rows 64 --cols 64 --channels 3 --classes 4 --seed 8 --learnable
# Two steps of batch 8 move the weights and the BatchNorm statistics away from their initial values.
common=(--epochs 1 --max-steps 2 --batch-size 8 --lr 0.01 --threads 2 --progress off)
checks=()
# name model data stem(recorded) extra flags...
try() {
  local name=$1 model=$2 data=$3 stem=$4; shift 4
  if run "$name.log" "$bin" --model "$model" --data "$data" "${common[@]}" --metrics "$name.jsonl" --save "$name.st" "$@"; then
    local got; got=$(meta_of stem "$name.st")
    if [[ $got == "$stem" ]]; then echo "ok: $name: --save records the $stem stem"
    else fail "$name: --save records stem '$got', expected $stem"; fi
    checks+=("$name.st" "$data" "$name.jsonl")
  else
    fail "$name: dptrain exit $?"; tail -5 "$name.log"
  fi
}
# Each model once, each block type with each stem (each start costs seconds of the pre-flight's
# memory probe, which builds the model and runs it at two batch sizes).
try r18_auto64 resnet18-tv d64 imagenet                       # auto at 64 pixels: imagenet (max-pool)
try r34_auto16 resnet34 d16 cifar                             # auto below 64: cifar
try r50_imagenet resnet50 d32 imagenet --stem imagenet --zero-init-residual
if ((${#checks[@]})); then
  "$py" "$lib_dir/torchvision_check.py" "${checks[@]}" || fail "torchvision's evaluation differs (above)"
fi
# dptrain evaluate builds a saved model with its recorded stem (imagenet at 32 pixels, where auto
# would say cifar): it scores the test set as the training run's own last evaluation did.
if [[ -f r50_imagenet.st ]]; then
  if run eval.log "$bin" evaluate --load r50_imagenet.st --data d32 --threads 2 --metrics eval.json; then
    python3 - r50_imagenet.jsonl eval.json <<'PY' || fail "evaluate of r50_imagenet.st differs from its training run"
import json, sys
ep = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "epoch"][-1]
ev = json.load(open(sys.argv[2]))
if abs(ev["top1"] - ep["test_acc"]) > 1e-12 or abs(ev["loss"] - ep["test_loss"]) > 1e-6 * abs(ep["test_loss"]):
    sys.exit(f"evaluate top1 {ev['top1']} loss {ev['loss']}, training test_acc {ep['test_acc']} test_loss {ep['test_loss']}")
print(f"ok: evaluate --load r50_imagenet.st: top1 {ev['top1']}, loss {ev['loss']:.6f} as in training")
PY
  else
    fail "evaluate --load r50_imagenet.st: exit $?"; tail -5 eval.log
  fi
fi
# A file of one stem does not load where the other is built: the refusal names both.
expect 2 "r34_auto16.st: holds a model with the cifar stem, this run builds the imagenet one (--stem)" -- \
  "$bin" --model resnet34 --data d16 "${common[@]}" --stem imagenet --resume r34_auto16.st
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
