#!/usr/bin/env bash
# --data synthetic:HxWxC:N:K (issue 32 item 4): random images and labels drawn from the seed train
# at 1 and 2 ranks with N training and ceil(N/10) test images; the same seed draws the same sets
# (the same losses), another seed others; the epoch's train_tflops is images/s x 3 x the forward
# FLOPs per image counted here from the layer shapes (LeNet and ResNet-18); malformed specs, a
# --data-format beside one, and a set larger than the limit or the memory are refused with exit 2,
# as is a batch larger than the memory, before the set is drawn.
# Usage: test_synthetic.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$tmp" || exit 1
lenet=(--model lenet --epochs 1 --max-steps 3 --batch-size 32 --threads 1 --progress off)

# check_epoch FILE FLOPS TRAIN TEST: the epoch record's counts and its TFLOP/s against images/s.
check_epoch() {
  python3 - "$@" <<'PY' || fail "epoch record of $1"
import json, sys
path, flops, train, test = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ep = [r for r in map(json.loads, open(path)) if r.get("type") == "epoch"][-1]
want = ep["images_per_second"] * 3 * flops / 1e12
if abs(ep["train_tflops"] - want) > 1e-9 * want:
    sys.exit(f"train_tflops {ep['train_tflops']} against {want}")
if (ep["train_count"], ep["test_count"]) != (train, test):
    sys.exit(f"counts {ep['train_count']}, {ep['test_count']} against {train}, {test}")
print(f"ok: {path}: {ep['train_tflops']:.3g} TFLOP/s = {ep['images_per_second']:.0f} img/s x 3 x {flops} FLOP")
PY
}
# Forward FLOPs per image, 2 per multiply-add of each convolution and Linear layer.
conv() { echo $((2 * $1 * $1 * $2 * $3 * $4 * $4)); }  # out_size out_channels in_channels kernel
lenet_flops=$(( $(conv 26 20 1 3) + $(conv 9 50 20 5) + 2 * 800 * 128 + 2 * 128 * 10 ))
# d2l's ResNet-18 on 32x32x3: 3x3 stem, four stages of two blocks (3x3 convolutions, 1x1 shortcuts).
r18=$(conv 32 64 3 3)
r18=$((r18 + 4 * $(conv 32 64 64 3)))
for s in "16 128 64" "8 256 128" "4 512 256"; do
  read -r o c i <<< "$s"
  r18=$((r18 + $(conv "$o" "$c" "$i" 3) + 3 * $(conv "$o" "$c" "$c" 3) + $(conv "$o" "$c" "$i" 1)))
done
r18=$((r18 + 2 * 512 * 7))  # 7 classes

expect 0 "TFLOP/s" -- "$bin" "${lenet[@]}" --data synthetic:28x28x1:256:10 --metrics one.jsonl
check_epoch one.jsonl "$lenet_flops" 96 26
expect 0 "TFLOP/s" -- "${mpi[@]}" -np 2 "$bin" "${lenet[@]}" --data synthetic:28x28x1:256:10 \
  --metrics two.jsonl
check_epoch two.jsonl "$lenet_flops" 96 26
expect 0 "TFLOP/s" -- "$bin" --model resnet18 --epochs 1 --max-steps 1 --batch-size 8 --threads 1 \
  --progress off --data synthetic:32x32x3:40:7 --metrics r18.jsonl
check_epoch r18.jsonl "$r18" 8 4

# The seed draws the sets: the same seed, the same losses; another, other losses.
losses() { python3 -c 'import json,sys; print([r["train_loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "epoch"])' "$1"; }
expect 0 "TFLOP/s" -- "$bin" "${lenet[@]}" --data synthetic:28x28x1:256:10 --metrics again.jsonl
expect 0 "TFLOP/s" -- "$bin" "${lenet[@]}" --data synthetic:28x28x1:256:10 --seed 7 --metrics other.jsonl
[[ $(losses one.jsonl) == "$(losses again.jsonl)" ]] || fail "the same seed drew other data: $(losses one.jsonl) $(losses again.jsonl)"
[[ $(losses one.jsonl) != "$(losses other.jsonl)" ]] || fail "seeds 42 and 7 drew the same data"

# Past a byte of classes (ImageNet's 1,000): labels are 16-bit, so classes 256..999 are drawn and
# counted. evaluate's per-class counts at 2 ranks add up to the test split (ceil(2000/10)), and
# with 1,000 uniform classes over 200 images about 3/4 of them fall at 256 or above (a byte's
# wrap-around would leave none there).
expect 0 "TFLOP/s" -- "$bin" "${lenet[@]}" --data synthetic:28x28x1:2000:1000 --save k1000.safetensors
expect 0 "evaluate: 200 test images" -- "${mpi[@]}" -np 2 "$bin" evaluate --load k1000.safetensors \
  --data synthetic:28x28x1:2000:1000 --metrics k1000.jsonl
python3 - k1000.jsonl <<'PY' || fail "1000 classes: evaluate's counts"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "evaluate"][-1]
counts = r["per_class_count"]
assert r["classes"] == 1000 and len(counts) == 1000, (r["classes"], len(counts))
assert sum(counts) == 200, sum(counts)
high = sum(counts[256:])
assert 100 <= high <= 200, f"{high} of 200 test images in classes 256..999"
assert sum(map(sum, r["confusion"])) == 200 and len(r["confusion"]) == 1000
print(f"ok: 1000 classes: {high} of 200 test images in classes 256..999")
PY
# Past 1,024 classes evaluate keeps each class's count and hits, not the k x k matrix.
expect 0 "TFLOP/s" -- "$bin" "${lenet[@]}" --data synthetic:28x28x1:2000:2000 --save k2000.safetensors
expect 0 "no confusion matrix above 1024 classes" -- "$bin" evaluate --load k2000.safetensors \
  --data synthetic:28x28x1:2000:2000 --metrics k2000.jsonl
python3 - k2000.jsonl <<'PY' || fail "2000 classes: evaluate's counts"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "evaluate"][-1]
counts, acc = r["per_class_count"], r["per_class_accuracy"]
assert len(counts) == 2000 and sum(counts) == 200 and r["confusion"] is None, r["confusion"]
hits = sum(round(a * c) for a, c in zip(acc, counts) if c)
assert hits == r["top1_correct"], (hits, r["top1_correct"])
print(f"ok: 2000 classes: no matrix, per-class hits add up to top-1's {hits}")
PY
# The counts themselves, from predict's rows (label, top class): each class's images and hits.
expect 0 "predict: top-1 classes of 200 test images" -- "$bin" predict --load k2000.safetensors \
  --data synthetic:28x28x1:2000:2000 --top-k 1 --output k2000.csv
python3 - k2000.jsonl k2000.csv <<'PY' || fail "2000 classes: evaluate's counts against predict's rows"
import csv, json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "evaluate"][-1]
count, hit = [0] * 2000, [0] * 2000
for row in list(csv.reader(open(sys.argv[2])))[1:]:
    label, top = int(row[1]), int(row[2])
    count[label] += 1
    hit[label] += top == label
assert r["per_class_count"] == count, "per-class counts"
assert r["top1_correct"] == sum(hit) <= r["top5_correct"], (r["top1_correct"], sum(hit), r["top5_correct"])
acc = [h / c if c else None for h, c in zip(hit, count)]
assert r["per_class_accuracy"] == acc, "per-class accuracy"
print(f"ok: 2000 classes: per-class counts and hits ({sum(hit)}) as predict's rows count them")
PY

# Refusals.
expect 2 "the image shape '32x32' is not HxWxC" -- "$bin" --data synthetic:32x32:10:10
expect 2 "expected synthetic:HxWxC:N:K" -- "$bin" --data synthetic:32x32x3:10
expect 2 "expected synthetic:HxWxC:N:K" -- "$bin" --data "synthetic:32x32x3:10:10:"
expect 2 "expected synthetic:HxWxC:N:K" -- "$bin" --data synthetic:  # nothing after it: no fields
expect 2 "the image shape '' is not HxWxC" -- "$bin" --data synthetic::10:10
expect 2 "the number of training images '0' is not a whole number" -- "$bin" --data synthetic:8x8x1:0:10
expect 2 "the number of classes '65537' is not a whole number in 1..65536" -- "$bin" --data synthetic:8x8x1:10:65537
expect 2 "the height '-3' is not a whole number" -- "$bin" --data synthetic:-3x8x1:10:2
expect 2 "the width '8 ' is not a whole number" -- "$bin" --data "synthetic:8x8 x1:10:2"
expect 2 "more than the limit of 17179869184" -- "$bin" --data synthetic:60000x60000x3:10:10
# A size whose byte count wraps at 2^64 (16777216 images of 2^40 + 2 bytes: 2^64 + 2^25) is
# refused as well: it was counted as 32 MiB, and the allocation failed (exit 3), at any rank count.
for np in 1 2; do
  expect 2 "--data synthetic:65536x65536x256:15252014:10: 2^64 or more bytes of images and labels, more than the limit of 17179869184 (16 GiB)" -- \
    "${mpi[@]}" -np "$np" "$bin" --data synthetic:65536x65536x256:15252014:10
done
expect 2 "--data-format cifar10 does not apply to --data synthetic:8x8x1:10:2" -- \
  "$bin" --data synthetic:8x8x1:10:2 --data-format cifar10
expect 2 "which --model lenet cannot take" -- "$bin" --model lenet --data synthetic:8x8x1:10:2
DPT_MEMORY_AVAILABLE=100M expect 2 "synthetic:224x224x3:4000:1000" -- \
  "$bin" --model resnet18 --data synthetic:224x224x3:4000:1000

# The batch's memory is checked from the spec, before any image is drawn: a 46341x46341 image
# (4.3 GB of data, within the memory) was drawn for 42 s before batch 2 was refused. With the log at
# debug, the load's own line ("data loaded in") must not come before the refusal; the data set's
# bytes are counted in, since the memory measured does not hold them yet.
DPT_MEMORY_AVAILABLE=300M expect 2 "GiB of the data set, read after this check" -- \
  "$bin" --model resnet18 --data synthetic:256x256x3:20:10 --batch-size 64 --log-level debug
grep -q "data loaded" "$tmp/out.txt" && fail "the data was drawn before the batch was refused"
grep -qF -- "--batch-size 64: training needs about" "$tmp/out.txt" || fail "not refused for --batch-size 64"
DPT_MEMORY_AVAILABLE=16G EXPECT_TIMEOUT=20 expect 2 "--batch-size 2: training needs about" -- \
  "$bin" --data synthetic:46341x46341x1:1:2 --batch-size 2 --log-level debug
grep -q "data loaded" "$tmp/out.txt" && fail "the 46341x46341 images were drawn before the batch was refused"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
