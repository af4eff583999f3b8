#!/usr/bin/env bash
# The torchvision-layout models (issue 32) from the command line: a ResNet-34 at 2 ranks learns a
# generated 32x32x3 set well above chance (as ResNet-18 does in test_own_data.sh), and --stem and
# --zero-init-residual are refused with exit 2 where the model has no such choice.
# (test_torchvision.sh checks their files against torchvision itself.)
# Usage: test_models.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$tmp" || exit 1
make_data() { python3 "$lib_dir/../data/make_data.py" "$@" > /dev/null || fail "make_data.py $*"; }

# ---- a ResNet-34 at 2 ranks learns a generated 32x32x3 set --------------------------------------
# The imagenet stem (16x down-sampling: the cifar stem's full-resolution stages would take minutes
# on 2 cores) also trains through the max-pool; --zero-init-residual starts each of the 16 blocks as
# its shortcut, which keeps a 34-layer network on batches of 16 per rank stable.
make_data learn --format npy --npy-4d --train 384 --test 128 --rows 32 --cols 32 --channels 3 --classes 10 --seed 5 --learnable
if RUN_TIMEOUT=600 run learn.log "${mpi[@]}" -np 2 "$bin" --model resnet34 --stem imagenet --zero-init-residual \
    --data learn --epochs 2 --batch-size 32 --lr 0.02 --augment crop,flip --normalize auto --threads 1 \
    --progress off --metrics learn.jsonl; then
  acc=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "test_acc" in r][-1]["test_acc"])' learn.jsonl)
  if python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.5 else 1)"; then echo "ok: ResNet-34 test accuracy $acc (chance 0.1)"
  else fail "ResNet-34 on the learnable set: test accuracy $acc, not >= 0.5 (chance 0.1)"; fi
else
  fail "ResNet-34 learnable run: exit $?"; tail -5 learn.log
fi

# ---- refusals: exit 2, naming the flag ----------------------------------------------------------
make_data c --format npy --npy-4d --train 16 --test 8 --rows 32 --cols 32 --channels 3 --classes 3 --seed 6
one=("$bin" --data c --epochs 1 --max-steps 1 --batch-size 8 --threads 1 --progress off)
expect 2 "--stem cifar: --model lenet has a fixed stem; --stem chooses one for resnet18-tv|resnet34|resnet50" -- \
  "${one[@]}" --model lenet --stem cifar
expect 2 "--stem imagenet: --model resnet18 has a fixed stem" -- "${one[@]}" --model resnet18 --stem imagenet
expect 2 "--stem: 'big' is not auto|imagenet|cifar" -- "${one[@]}" --model resnet50 --stem big
expect 2 "--zero-init-residual: --model lenet has no residual blocks" -- "${one[@]}" --model lenet --zero-init-residual
# auto is every model's default, so it is accepted everywhere.
expect 0 "saved" -- "${one[@]}" --model lenet --stem auto --save lenet.st
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
