#!/usr/bin/env bash
# Your own images (issue 21), end to end through dptrain: synthetic data sets in every format
# (tests/data/make_data.py: CIFAR-10 and CIFAR-100 records, idx4 RGB, .npy) train with --augment
# crop,flip and --normalize auto at 1, 2 and 4 ranks to the same step records (to summation order:
# every draw is a function of seed, epoch and image); a ResNet-18 at 2 ranks learns a generated
# 32x32x3 set well above chance; what the data made of the run is in --save's metadata; bad data
# and flags that do not fit the data are refused with exit 2 naming the file or flag.
# Usage: test_own_data.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
make_data() { python3 "$lib_dir/../data/make_data.py" "$@" > /dev/null || fail "make_data.py $*"; }
cd "$tmp" || exit 1
small=(--model lenet --epochs 1 --max-steps 4 --batch-size 32 --eval-batch-size 64 --threads 1 --progress off
       --metrics-every 1)

# close A B: the step records of two --metrics files agree: the same steps, losses and gradient
# norms within 1e-4 relative (the all-reduce adds 1, 2 or 4 partial sums in another order).
close() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def steps(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if r.get("type") == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
if sorted(a) != sorted(b) or not a:
    sys.exit(f"steps {sorted(a)} against {sorted(b)}")
for s in a:
    for k in ("loss", "grad_norm"):
        x, y = a[s][k], b[s][k]
        if abs(x - y) > 1e-4 * max(abs(x), abs(y)):
            sys.exit(f"step {s}: {k} {x} against {y}")
PY
}

# ---- every format, 1, 2 and 4 ranks, augmented and normalised -----------------------------------
make_data c10 --format cifar10 --train 160 --test 64 --seed 1
make_data c100 --format cifar100 --train 160 --test 64 --classes 100 --seed 2
make_data rgb --format idx --gzip --train 160 --test 64 --rows 20 --cols 18 --channels 3 --classes 7 --seed 3
make_data npy --format npy --train 160 --test 64 --rows 16 --cols 16 --channels 1 --classes 5 --seed 4 --label-dtype '<i8'
declare -A shape=([c10]="cifar10, 160 training and 64 test images of 32x32x3 (HxWxC), 10 classes"
                  [c100]="cifar100, 160 training and 64 test images of 32x32x3 (HxWxC), 100 classes"
                  [rgb]="idx, 160 training and 64 test images of 20x18x3 (HxWxC), 7 classes"
                  [npy]="npy, 160 training and 64 test images of 16x16x1 (HxWxC), 5 classes")
for d in c10 c100 rgb npy; do
  for np in 1 2 4; do
    if run "$d.$np.log" "${mpi[@]}" -np "$np" "$bin" "${small[@]}" --data "$d" --augment crop,flip --normalize auto \
        --metrics "$d.$np.jsonl"; then
      grep -qF "data: ${shape[$d]}; normalize " "$d.$np.log" || fail "$d at $np ranks: banner lacks '${shape[$d]}'"
    else
      fail "$d at $np ranks: exit $?"; tail -5 "$d.$np.log"
    fi
  done
  for np in 2 4; do
    if err=$(close "$d.1.jsonl" "$d.$np.jsonl"); then echo "ok: $d at $np ranks = 1 rank"
    else fail "$d at $np ranks differs from 1 rank: $err"; fi
  done
  # Augmentation is in effect: the same run without it takes other steps.
  run "$d.plain.log" "${mpi[@]}" -np 1 "$bin" "${small[@]}" --data "$d" --normalize auto --metrics "$d.plain.jsonl"
  if close "$d.1.jsonl" "$d.plain.jsonl" > /dev/null 2>&1; then fail "$d: --augment crop,flip changed nothing"
  else echo "ok: $d: --augment changes the steps"; fi
done

# ---- what the data made of the run is recorded --------------------------------------------------
if run save.log "${mpi[@]}" -np 1 "$bin" "${small[@]}" --data c10 --augment crop=2,flip --normalize auto --save c10.st; then
  [[ $(meta_of input_shape c10.st) == "32,32,3" ]] || fail "--save input_shape is '$(meta_of input_shape c10.st)'"
  [[ $(meta_of augment c10.st) == "crop=2,flip" ]] || fail "--save augment is '$(meta_of augment c10.st)'"
  [[ $(meta_of data_format c10.st) == "cifar10" ]] || fail "--save data_format is '$(meta_of data_format c10.st)'"
  # The recorded mean and std are those of the training set's pixels / 255, per channel.
  python3 - c10 "$(meta_of normalize_mean c10.st)" "$(meta_of normalize_std c10.st)" <<'PY' || fail "--save's normalize_mean/std"
import glob, math, sys
d, mean, std = sys.argv[1], [float(v) for v in sys.argv[2].split(",")], [float(v) for v in sys.argv[3].split(",")]
s, q, n = [0.0] * 3, [0.0] * 3, 0
for f in sorted(glob.glob(f"{d}/data_batch_*.bin")):
    raw = open(f, "rb").read()
    for r in range(0, len(raw), 3073):
        for c in range(3):
            plane = raw[r + 1 + 1024 * c: r + 1 + 1024 * (c + 1)]
            s[c] += sum(plane) / 255
            q[c] += sum(v * v for v in plane) / 255 / 255
        n += 1024
for c in range(3):
    m = s[c] / n
    sd = math.sqrt(q[c] / n - m * m)
    assert abs(m - mean[c]) < 1e-6 and abs(sd - std[c]) < 1e-6, (c, m, mean[c], sd, std[c])
print("ok: normalize_mean/std are the training set's per-channel statistics")
PY
else
  fail "--save run: exit $?"; tail -5 save.log
fi

# ---- a resumed augmented run ends where the uninterrupted one does (the draws are recomputed) -----
aug=("${mpi[@]}" -np 2 "$bin" --model lenet --max-steps 3 --batch-size 32 --eval-every 0 --threads 1 --progress off
     --data c10 --augment crop,flip --normalize auto --checkpoint-every 1)
if run whole.log "${aug[@]}" --epochs 2 --checkpoint-path whole.ckpt --save whole.st &&
   run first.log "${aug[@]}" --epochs 1 --checkpoint-path part.ckpt &&
   run rest.log "${aug[@]}" --epochs 2 --checkpoint-path part.ckpt --resume part.ckpt --allow-config-change --save part.st; then
  if same_tensors whole.st part.st > /dev/null; then echo "ok: an augmented run resumed after epoch 1 ends bit for bit as one run"
  else fail "an augmented run resumed after epoch 1 differs from the uninterrupted one"; fi
else
  fail "augmented resume runs failed"; tail -5 whole.log first.log rest.log
fi

# ---- a ResNet-18 at 2 ranks learns a generated 32x32x3 set --------------------------------------
make_data learn --format npy --npy-4d --train 384 --test 128 --rows 32 --cols 32 --channels 3 --classes 10 --seed 5 --learnable
if RUN_TIMEOUT=600 run learn.log "${mpi[@]}" -np 2 "$bin" --model resnet18 --data learn --epochs 3 --batch-size 32 \
    --lr 0.05 --augment crop,flip --normalize auto --threads 1 --progress off --metrics learn.jsonl; then
  acc=$(python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if "test_acc" in r][-1]["test_acc"])' learn.jsonl)
  if python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.5 else 1)"; then echo "ok: ResNet-18 test accuracy $acc (chance 0.1)"
  else fail "ResNet-18 on the learnable set: test accuracy $acc, not >= 0.5 (chance 0.1)"; fi
else
  fail "ResNet-18 learnable run: exit $?"; tail -5 learn.log
fi

# ---- refusals: exit 2, naming the flag or the file ----------------------------------------------
one=("${mpi[@]}" -np 1 "$bin" "${small[@]}")
make_data tiny --format npy --train 64 --test 32 --rows 8 --cols 8 --channels 1 --classes 3 --seed 6
expect 2 "--model lenet cannot take" -- "${one[@]}" --data tiny
expect 2 "needs images of at least 14x14" -- "${one[@]}" --data tiny
expect 2 "the data's images have 3" -- "${one[@]}" --data c10 --normalize 0.5/0.2
expect 2 "--normalize '0.5,x/1,1'" -- "${one[@]}" --data c10 --normalize 0.5,x/1,1
expect 2 "--normalize '/' gives no means" -- "${one[@]}" --data c10 --normalize /
expect 2 "standard deviation 0 is not > 0" -- "${one[@]}" --data c10 --normalize 0,0,0/1,0,1
# Values are stored as floats: one that overflows a float, or a subnormal standard deviation, is
# refused at parsing instead of making every input 0 or infinite.
expect 2 "--normalize '0,0,0/1e39,1,1': standard deviation 1e39 is outside a float's range" -- "${one[@]}" \
  --data c10 --normalize 0,0,0/1e39,1,1
expect 2 "standard deviation 1e-40 is below the smallest normal float" -- "${one[@]}" --data c10 --normalize 0,0,0/1,1e-40,1
expect 2 "--augment 'crop=40'" -- "${one[@]}" --data c10 --augment crop=40
expect 2 "--augment 'rotate'" -- "${one[@]}" --data c10 --augment rotate
expect 2 "--data-format: 'png'" -- "${one[@]}" --data c10 --data-format png
# A CIFAR file that is not a whole number of records.
cp -r c10 cut && truncate -s -5 cut/data_batch_1.bin
expect 2 "cut/data_batch_1.bin" -- "${one[@]}" --data cut
# Two formats in one directory: the user must say which.
cp -r c10 both && cp npy/*.npy both/
expect 2 "--data-format" -- "${one[@]}" --data both
expect 0 "data: npy" -- "${one[@]}" --data both --data-format npy
# Train and test of different shapes.
make_data other --format npy --train 64 --test 32 --rows 18 --cols 18 --channels 1 --classes 5 --seed 7
mkdir mixed && cp npy/train_*.npy mixed/ && cp other/test_*.npy mixed/
expect 2 "test_images.npy" -- "${one[@]}" --data mixed
# A checkpoint of one image shape is not resumed on another (ResNet-18's tensors would fit).
make_data rn16 --format npy --train 64 --test 32 --rows 16 --cols 16 --channels 1 --classes 5 --seed 8
make_data rn18 --format npy --train 64 --test 32 --rows 18 --cols 18 --channels 1 --classes 5 --seed 8
rn=(--model resnet18 --epochs 1 --max-steps 1 --batch-size 8 --eval-every 0 --threads 1 --progress off)
if run rn16.log "${mpi[@]}" -np 1 "$bin" "${rn[@]}" --data rn16 --checkpoint-every 1 --checkpoint-path rn.ckpt; then
  expect 2 "was trained on images of 16,16,1" -- "${mpi[@]}" -np 1 "$bin" "${rn[@]}" --data rn18 --resume rn.ckpt --epochs 2
else
  fail "ResNet-18 16x16 checkpoint run: exit $?"; tail -5 rn16.log
fi

# ---- a data set larger than the memory: exit 2 before anything is read -------------------------
# The size comes from the headers (a .gz's decompressed size, a sparse file's claimed one), times
# the ranks on the host, each of which holds a copy; DPT_MEMORY_AVAILABLE stands for a host (or a
# memory cgroup) that has less. Before the check, such files ended in the OOM killer's SIGKILL.
make_data mem --format idx --train 64 --test 32 --rows 28 --cols 28 --classes 3 --seed 9
# train images: 50000 x 28 x 28 = 39200000 bytes of zeros in a .gz of about 40 KB; with the
# labels (64) and the test split (32 x 784 + 32), 39225184 bytes a rank.
python3 - mem/train-images-idx3-ubyte.gz <<'PY'
import gzip, struct, sys
with gzip.open(sys.argv[1], "wb") as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, 50000, 28, 28))
    for _ in range(50):
        f.write(bytes(784000))
PY
rm -f mem/train-images-idx3-ubyte
two=("${mpi[@]}" -np 2 "$bin" "${small[@]}")
DPT_MEMORY_AVAILABLE=60000000 expect 2 "the data set needs 0.07 GiB (78450368 bytes) of memory on this host (2 rank(s)" -- \
  "${two[@]}" --data mem
for needle in "the largest, mem/train-images-idx3-ubyte.gz, 0.04 GiB (39200000 bytes)" \
              "but 0.06 GiB (60000000 bytes) is available (DPT_MEMORY_AVAILABLE)"; do
  grep -qF -- "$needle" out.txt || fail "the refusal lacks '$needle': $(grep error out.txt)"
done
# One rank's copy fits: the check passes and the reader goes on (to the 50000 images' 64 labels).
DPT_MEMORY_AVAILABLE=60000000 expect 2 "image and label counts disagree" -- "${one[@]}" --data mem
# A sparse raw idx4 whose header claims 300 MB (100000 x 32 x 32 x 3), and a sparse .npy the same.
make_data sparse --format idx --train 64 --test 32 --rows 32 --cols 32 --channels 3 --classes 3 --seed 9
rm -f sparse/train-images-idx4-ubyte*
printf '\0\0\10\4\0\1\206\240\0\0\0\40\0\0\0\40\0\0\0\3' >sparse/train-images-idx4-ubyte
truncate -s $((20 + 307200000)) sparse/train-images-idx4-ubyte
DPT_MEMORY_AVAILABLE=100M expect 2 "the largest, sparse/train-images-idx4-ubyte, 0.29 GiB (307200000 bytes)" -- \
  "${one[@]}" --data sparse
make_data sparsenpy --format npy --train 64 --test 32 --rows 32 --cols 32 --channels 3 --classes 3 --seed 9
python3 - sparsenpy/train_images.npy <<'PY'
import sys
head = b"{'descr': '|u1', 'fortran_order': False, 'shape': (100000, 32, 32, 3), }"
head += b" " * (127 - 10 - len(head)) + b"\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head)
    f.truncate(128 + 307200000)
PY
DPT_MEMORY_AVAILABLE=100M expect 2 "the largest, sparsenpy/train_images.npy, 0.29 GiB (307200000 bytes)" -- \
  "${one[@]}" --data sparsenpy
DPT_MEMORY_AVAILABLE=lots expect 2 "DPT_MEMORY_AVAILABLE=lots: not a number of bytes" -- "${one[@]}" --data c10
# A batch larger than the memory is refused from the headers' image shape, before the images are
# read (the data set itself fits): the load's debug line must not come first. 1024x1024x3 images of
# zeros in .gz files of a few KB (4 training, 2 test, the labels' counts).
make_data big --format idx --gzip --train 4 --test 2 --rows 8 --cols 8 --channels 3 --classes 2 --seed 9
python3 - big <<'PY'
import gzip, struct, sys
for split, n in (("train", 4), ("t10k", 2)):
    with gzip.open(f"{sys.argv[1]}/{split}-images-idx4-ubyte.gz", "wb") as f:
        f.write(struct.pack(">BBBBIIII", 0, 0, 8, 4, n, 1024, 1024, 3))
        f.write(bytes(n * 1024 * 1024 * 3))
PY
DPT_MEMORY_AVAILABLE=500M expect 2 "--batch-size 4: training needs about" -- \
  "${mpi[@]}" -np 1 "$bin" --model resnet18 --data big --batch-size 4 --log-level debug
grep -q "data loaded" out.txt && fail "the images were read before the batch was refused"
# The check has no margin: memory that runs out while the data is read (here an address-space limit
# under a data set twice its size, which the check, told of 100 GiB, lets pass) ended in
# "unexpected failure: std::bad_alloc", exit 3, naming nothing. The smallest limit the program
# (CUDA libraries included, in a GPU build) loads under is taken.
oom=""
for kib in 1500000 3000000 6000000; do
  n=$((kib * 1024 * 2 / 12288)) # 64x64x3 images: twice the limit
  rc=0
  (ulimit -v "$kib" && DPT_MEMORY_AVAILABLE=100G exec "$bin" "${small[@]}" --data "synthetic:64x64x3:$n:2") \
    >oom.txt 2>&1 || rc=$?
  [[ $rc -eq 127 ]] && continue # the libraries did not load under the limit: a larger one
  oom=$kib
  [[ $rc -eq 2 ]] || fail "out of memory reading the data: exit $rc, want 2: $(tail -2 oom.txt)"
  grep -qF -- "--data synthetic:64x64x3:$n:2: this host ran out of memory reading it" oom.txt ||
    fail "out of memory reading the data: no message naming --data: $(tail -2 oom.txt)"
  break
done
[[ -n $oom ]] || fail "dptrain did not load under an address-space limit of 6 GB: $(tail -2 oom.txt)"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
