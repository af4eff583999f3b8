#!/usr/bin/env bash
# dptrain --device cuda from the command line: LeNet for one epoch on one rank learns (test accuracy
# > 0.5) and names its GPU in the banner; two ranks (NCCL on two GPUs, the MPI fallback with its log
# line on one) learn as well, also with gradients sent as bf16 (--grad-dtype; fp16 runs a few steps);
# ResNet-18 with --sync-bn at two ranks, --tf32, --cudnn-nondeterministic, --precision bf16 and bf16
# activations (legacy and graph API) run a few steps, LeNet with bf16 activations learns an epoch;
# CUDA graphs are captured by default and not with --no-cuda-graphs; a batch too large for the GPU is refused
# before the first step; with cuDNN's graph API, a resumed run replays each rank's plans and ends
# with the uninterrupted run's bytes.
# Skips (exit 77) where no CUDA device is visible. Usage: test_dptrain_gpu.sh path/to/dptrain
set -uo pipefail
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}
mpi=("${MPIRUN:-mpirun}" -np 2 --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
fails=0
if [[ ! -e $data/train-images-idx3-ubyte.gz && ! -e $data/train-images-idx3-ubyte ]]; then
  # No Fashion-MNIST here: a learnable synthetic set (class k is a bright band at rows 2+2k, as in
  # tests/test_util.h), 12800 training and 2000 test images.
  data=$tmp/synthetic
  mkdir -p "$data"
  python3 - "$data" <<'PY'
import gzip, random, struct, sys
random.seed(7)
for split, n in (("train", 12800), ("t10k", 2000)):
    labels = bytes(random.randrange(10) for _ in range(n))
    pixels = bytearray()
    for k in labels:
        for p in range(784):
            row = p // 28
            pixels.append(int((200 if 2 + 2 * k <= row < 4 + 2 * k else 20) + 40 * random.random()))
    with gzip.open(f"{sys.argv[1]}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">iiii", 0x803, n, 28, 28) + bytes(pixels))
    with gzip.open(f"{sys.argv[1]}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">ii", 0x801, n) + labels)
PY
  echo "no data set found: using a synthetic one in $data"
fi

# run NAME TIMEOUT command...: output in $tmp/NAME.out, exit code in $rc.
run() {
  local name=$1 limit=$2
  shift 2
  timeout -k 5 "$limit" "$@" > "$tmp/$name.out" 2>&1
  rc=$?
}
check() {  # check CONDITION-EXIT-CODE WHAT [LOG]
  if [[ $1 -eq 0 ]]; then echo "ok: $2"; else echo "FAIL: $2"; [[ -n ${3:-} ]] && tail -15 "$3"; fails=$((fails + 1)); fi
}
# acc FILE: the test accuracy of the last epoch record of a --metrics file.
acc() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"epoch\"" in l][-1]["test_acc"])' "$1"; }
above() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$1" "$2"; }

run probe 120 "$bin" --device cuda --epochs 1 --max-steps 1 --eval-every 0 --data "$data"
if grep -q "no CUDA device visible" "$tmp/probe.out"; then
  echo "SKIP: no CUDA device visible"
  exit 77
fi
check $rc "one step on the GPU runs (exit $rc)" "$tmp/probe.out"

run one 300 "$bin" --device cuda --model lenet --epochs 1 --data "$data" --metrics "$tmp/one.jsonl"
check $rc "1 rank, LeNet, 1 epoch (exit $rc)" "$tmp/one.out"
grep -q "rank 0: .*, cuda:0 (" "$tmp/one.out"; check $? "the banner names the GPU" "$tmp/one.out"
a=$(acc "$tmp/one.jsonl" 2>/dev/null || echo 0)
above "$a" 0.5; check $? "1 rank: test accuracy $a > 0.5"
grep -h "s/epoch" "$tmp/one.out" | tail -1

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
run two 300 "${mpi[@]}" "$bin" --device cuda --model lenet --epochs 1 --data "$data" --metrics "$tmp/two.jsonl"
check $rc "2 ranks, LeNet, 1 epoch ($gpus GPU(s) listed; exit $rc)" "$tmp/two.out"
a=$(acc "$tmp/two.jsonl" 2>/dev/null || echo 0)
above "$a" 0.5; check $? "2 ranks: test accuracy $a > 0.5"
if [[ $gpus -lt 2 ]]; then
  grep -q "ranks share a GPU" "$tmp/two.out"; check $? "one GPU for two ranks: the MPI fallback says so" "$tmp/two.out"
fi

run gradbf16 300 "${mpi[@]}" "$bin" --device cuda --model lenet --epochs 1 --grad-dtype bf16 --data "$data" \
  --metrics "$tmp/gradbf16.jsonl"
check $rc "2 ranks, LeNet, --grad-dtype bf16, 1 epoch (exit $rc)" "$tmp/gradbf16.out"
a=$(acc "$tmp/gradbf16.jsonl" 2>/dev/null || echo 0)
above "$a" 0.5; check $? "2 ranks, --grad-dtype bf16: test accuracy $a > 0.5"
run gradfp16 300 "${mpi[@]}" "$bin" --device cuda --model lenet --epochs 1 --max-steps 10 --grad-dtype fp16 \
  --eval-every 0 --data "$data"
check $rc "2 ranks, LeNet, --grad-dtype fp16, 10 steps (exit $rc)" "$tmp/gradfp16.out"

run syncbn 300 "${mpi[@]}" "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 5 --batch-size 64 \
  --sync-bn --eval-every 0 --data "$data"
check $rc "2 ranks, ResNet-18, --sync-bn, 5 steps (exit $rc)" "$tmp/syncbn.out"

run tf32 300 "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 5 --batch-size 64 --tf32 \
  --eval-every 0 --data "$data"
check $rc "ResNet-18 with --tf32, 5 steps (exit $rc)" "$tmp/tf32.out"

# cuDNN's non-deterministic engines in the plan search too (strict fp32, where the weight
# gradients' atomic engines are the likeliest winners).
run nondet 300 "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 5 --batch-size 64 \
  --cudnn-nondeterministic --eval-every 0 --data "$data"
check $rc "ResNet-18 with --cudnn-nondeterministic, 5 steps (exit $rc)" "$tmp/nondet.out"

run bf16 300 "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 5 --batch-size 64 --precision bf16 \
  --eval-every 0 --log-level debug --data "$data"
check $rc "ResNet-18 with --precision bf16, 5 steps (exit $rc)" "$tmp/bf16.out"
grep -q "CUDA graph of the training step captured" "$tmp/bf16.out"
check $? "the training step is captured as a CUDA graph (--log-level debug says so)" "$tmp/bf16.out"

# 16-bit activations (--activation-dtype bf16) on the legacy and the graph API: ResNet-18 runs and
# is captured; LeNet learns a whole epoch as in fp32 (accuracy above the same bar).
for api in legacy graph; do
  run act16_$api 300 env DPT_CUDNN_API=$api "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 5 \
    --batch-size 64 --precision bf16 --activation-dtype bf16 --eval-every 0 --log-level debug --data "$data"
  if [[ $api == graph ]] && grep -q "has no cuDNN graph API" "$tmp/act16_$api.out"; then
    echo "skip: DPT_CUDNN_API=graph is not available in this build"
    continue
  fi
  check $rc "ResNet-18 with bf16 activations ($api API), 5 steps (exit $rc)" "$tmp/act16_$api.out"
  grep -q "CUDA graph of the training step captured" "$tmp/act16_$api.out"
  check $? "bf16 activations ($api API): the training step is captured as a CUDA graph" "$tmp/act16_$api.out"
done
run act16lenet 300 "$bin" --device cuda --model lenet --epochs 1 --activation-dtype bf16 --data "$data" \
  --metrics "$tmp/act16lenet.jsonl"
check $rc "LeNet with bf16 activations, 1 epoch (exit $rc)" "$tmp/act16lenet.out"
a=$(acc "$tmp/act16lenet.jsonl" 2>/dev/null || echo 0)
above "$a" 0.5; check $? "LeNet with bf16 activations: test accuracy $a > 0.5"

run nographs 300 "$bin" --device cuda --model lenet --epochs 1 --max-steps 5 --eval-every 0 --no-cuda-graphs \
  --log-level debug --data "$data"
check $rc "--no-cuda-graphs, 5 steps (exit $rc)" "$tmp/nographs.out"
! grep -q "CUDA graph of" "$tmp/nographs.out"; check $? "--no-cuda-graphs captures nothing" "$tmp/nographs.out"

run bad 60 "$bin" --device cuda --model lenet --epochs 1 --batch-size 0 --data "$data"
[[ $rc -eq 2 ]] && grep -q -- "--batch-size" "$tmp/bad.out"; check $? "a bad flag is still exit 2 on the GPU path"

# ResNet-18 needs about 11 MiB per training image, so a batch of the whole training set
# (Fashion-MNIST: 60000 images, over 600 GiB) is more than any GPU has: refused before the first
# step, naming the GPU. The synthetic set's 12800 (about 137 GiB) fit an H200 (2026-11-26): there
# the pre-flight's estimate must say it fits, and the step must run.
train_images=$(python3 - "$data" <<'PY'
import gzip, os, struct, sys
path = os.path.join(sys.argv[1], "train-labels-idx1-ubyte")
f = gzip.open(path + ".gz") if os.path.exists(path + ".gz") else open(path, "rb")
print(struct.unpack(">ii", f.read(8))[1])
PY
)
run gpumem 120 "$bin" --device cuda --model resnet18 --epochs 1 --max-steps 1 --batch-size "$train_images" \
  --eval-every 0 --log-level debug --data "$data"
if [[ $rc -eq 2 ]]; then
  grep -q "more memory on rank 0's GPU cuda:" "$tmp/gpumem.out"
  check $? "a batch of all $train_images images, too large for the GPU, is refused with the estimate" "$tmp/gpumem.out"
else
  [[ $rc -eq 0 && $train_images -lt 60000 ]] && grep -q "memory estimate on rank 0's GPU" "$tmp/gpumem.out"
  check $? "a batch of all $train_images images: the GPU holds it, the estimate said so, the step ran (exit $rc)" \
    "$tmp/gpumem.out"
fi
grep -q "memory estimate on rank 0's GPU" "$tmp/bf16.out"
check $? "a batch that fits passes the GPU estimate (--log-level debug shows it)" "$tmp/bf16.out"

# cuDNN's graph API (DPT_CUDNN_API=graph): 2 ranks of ResNet-18 for 2 epochs of 3 steps with a
# checkpoint every 2 steps, against the same run resumed from its step-4 checkpoint: each rank's
# timed plans go into the checkpoint (conv_plans.rank<r>) and are replayed, so the two final
# models are the same bytes.
if DPT_CUDNN_API=graph "$bin" --device cuda --epochs 1 --max-steps 1 \
    --eval-every 0 --data "$data" > "$tmp/graphprobe.out" 2>&1; then
  g=(env DPT_CUDNN_API=graph "${mpi[@]}" "$bin" --device cuda --model resnet18 --batch-size 64 --max-steps 3
     --epochs 2 --eval-every 0 --data "$data")
  mkdir -p "$tmp/g"  # --checkpoint-path's directory must exist (dptrain refuses a missing one)
  run graphfull 300 "${g[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path "$tmp/g/ck.st" \
    --save "$tmp/gfull.safetensors"
  check $rc "graph API: 2 ranks, ResNet-18, 2 epochs (exit $rc)" "$tmp/graphfull.out"
  python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; m=json.loads(f.read(n))["__metadata__"]; sys.exit(0 if "conv_plans.rank0" in m and "conv_plans.rank1" in m else 1)' "$tmp/g/ck.step4.st"
  check $? "graph API: the checkpoint holds each rank's convolution plans" "$tmp/graphfull.out"
  run graphresume 300 "${g[@]}" --resume "$tmp/g/ck.step4.st" --save "$tmp/gresumed.safetensors"
  check $rc "graph API: the run resumed from step 4 (exit $rc)" "$tmp/graphresume.out"
  # Every tensor byte for byte (the metadata differs: the resumed run's flags).
  python3 - "$tmp/gfull.safetensors" "$tmp/gresumed.safetensors" <<'PY'
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
diff = sorted(k for k in a if a[k] != b.get(k))
print("differing tensors:", diff[:8] if diff else "none")
sys.exit(1 if diff or a.keys() != b.keys() else 0)
PY
  check $? "graph API: resumed and uninterrupted runs end with the same tensors, bit for bit" "$tmp/graphresume.out"
else
  echo "skip: DPT_CUDNN_API=graph is not available in this build ($(tail -1 "$tmp/graphprobe.out"))"
fi

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
