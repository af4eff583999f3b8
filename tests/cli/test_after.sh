#!/usr/bin/env bash
# After training (issue 32 item 2), end to end on generated data with LeNet: `dptrain evaluate`
# gives the same JSON at 1, 2 and 4 ranks and the training run's own test accuracy, its numbers
# agree with each other and with predict's probabilities; `dptrain predict` writes the same CSV at
# 1, 2 and 4 ranks; --init-from starts from the file's very tensors (a step at lr 1e-30 leaves them
# as they were), re-initialises a head of another class count and says so, refuses other
# mismatches naming the tensor; fine-tuning a model of a related task beats training from scratch
# by a wide margin after one epoch; bad files, flags and data that do not fit are exit 2.
# Usage: test_after.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
make_data() { python3 "$lib_dir/../data/make_data.py" "$@" > /dev/null || fail "make_data.py $*"; }
cd "$tmp" || exit 1
base=(--threads 1)
train=("$bin" "${base[@]}" --progress off --batch-size 32)

# st_edit IN OUT [meta KEY=VALUE | nometa | shape NAME=D1,D2,.. | fill NAME=FLOAT]...: a copy of a
# safetensors file with its metadata changed or dropped, one tensor given another shape (zeros), or
# every element of one F32 tensor set to FLOAT (nan, inf, 0.5).
st_edit() {
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, ops = sys.argv[1], sys.argv[2], sys.argv[3:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = head.pop("__metadata__", {})
data = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items()}
for op, arg in zip(ops[::2], ops[1::2] + [""]):
    if op == "meta":
        k, v = arg.split("=", 1); meta[k] = v
    elif op == "shape":
        k, dims = arg.split("="); shape = [int(d) for d in dims.split(",")]
        head[k]["shape"] = shape
        count = 1
        for d in shape: count *= d
        data[k] = bytes(4 * count)
    elif op == "fill":
        k, v = arg.split("=")
        data[k] = struct.pack("<f", float(v)) * (len(data[k]) // 4)
if "nometa" in ops:
    meta = None
out, at = {}, 0
for k in head:
    out[k] = {"dtype": head[k]["dtype"], "shape": head[k]["shape"], "data_offsets": [at, at + len(data[k])]}
    at += len(data[k])
if meta is not None:
    out["__metadata__"] = meta
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(data[k] for k in head))
PY
}

# ---- a model, evaluated at 1, 2 and 4 ranks -------------------------------------------------------
make_data task --format idx --train 1000 --test 200 --rows 16 --cols 16 --classes 10 --seed 7 --learnable
run train.log "${train[@]}" --data task --epochs 2 --save m.st --metrics train.jsonl ||
  { fail "training the model to evaluate: exit $?"; tail -5 train.log; }
for np in 1 2 4; do
  run "eval.$np.log" "${mpi[@]}" -np "$np" "$bin" evaluate "${base[@]}" --load m.st --data task \
    --eval-batch-size 16 --metrics "eval.$np.json" || { fail "evaluate at $np ranks: exit $?"; tail -5 "eval.$np.log"; }
done
for np in 2 4; do
  if cmp -s eval.1.json "eval.$np.json"; then echo "ok: evaluate at $np ranks = 1 rank, byte for byte"
  else fail "evaluate at $np ranks differs from 1 rank: $(cat "eval.$np.json")"; fi
done
grep -qF "rows: true class; columns: predicted class" eval.1.log || fail "evaluate printed no confusion matrix"
# The JSON's numbers among themselves, and against the training run's last evaluation, which scored
# the 200 test images as one batch, as evaluate does at the default --eval-batch-size (the logits
# of a batch's images depend in their last bits on the batch's size: GEMM blocking).
run eval.full.log "$bin" evaluate "${base[@]}" --load m.st --data task --metrics eval.full.json ||
  fail "evaluate at the default --eval-batch-size: exit $?"
if err=$(python3 - eval.full.json train.jsonl <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
t = [r for r in map(json.loads, open(sys.argv[2])) if r.get("type", "epoch") == "epoch"][-1]
cm, n, k = e["confusion"], e["count"], e["classes"]
assert n == 200 and k == 10 and len(cm) == k and all(len(r) == k for r in cm), "shape"
assert sum(map(sum, cm)) == n, "confusion sums to %d" % sum(map(sum, cm))
diag = sum(cm[i][i] for i in range(k))
assert diag == e["top1_correct"] and e["top1"] == diag / n, "top-1 is not the diagonal"
for i in range(k):
    c = sum(cm[i])
    assert e["per_class_count"][i] == c and e["per_class_accuracy"][i] == (cm[i][i] / c if c else None), i
assert e["top1_correct"] <= e["top5_correct"] <= n and e["top5_k"] == 5
assert e["top1_correct"] == round(t["test_acc"] * t["test_count"]), \
    "evaluate's top-1 %d against training's %s of %d" % (e["top1_correct"], t["test_acc"], t["test_count"])
assert abs(e["loss"] - t["test_loss"]) < 1e-5 * max(1, t["test_loss"]), (e["loss"], t["test_loss"])
assert 0.3 < e["top1"] < 1, "a model between chance and perfect: %s" % e["top1"]
PY
); then echo "ok: evaluate's JSON is consistent and matches the training run's test accuracy"
else fail "evaluate's JSON: $err"; fi

# The file's normalisation is applied: a model trained on RGB images with --normalize auto scores
# what its training run's last evaluation scored (loss to 1e-5; without the normalisation the
# inputs would be others).
make_data rgb --format idx --train 600 --test 100 --rows 16 --cols 16 --channels 3 --classes 4 --seed 5 --learnable
run rgb.log "${train[@]}" --data rgb --epochs 1 --normalize auto --save rgb.st --metrics rgb.jsonl ||
  fail "training on RGB with --normalize auto: exit $?"
run rgb.eval.log "${mpi[@]}" -np 2 "$bin" evaluate "${base[@]}" --load rgb.st --data rgb --metrics rgb.json ||
  fail "evaluate of a normalised model: exit $?"
grep -qF "normalize 0." rgb.eval.log || fail "evaluate does not name the file's normalisation: $(head -2 rgb.eval.log)"
if err=$(python3 - rgb.json rgb.jsonl <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
t = [r for r in map(json.loads, open(sys.argv[2])) if r.get("type", "epoch") == "epoch"][-1]
assert e["top1_correct"] == round(t["test_acc"] * t["test_count"]), (e["top1"], t["test_acc"])
assert abs(e["loss"] - t["test_loss"]) < 1e-5 * max(1, t["test_loss"]), (e["loss"], t["test_loss"])
PY
); then echo "ok: evaluate applies the file's normalisation"; else fail "normalised model: $err"; fi

# ---- predict at 1, 2 and 4 ranks ------------------------------------------------------------------
for np in 1 2 4; do
  run "pred.$np.log" "${mpi[@]}" -np "$np" "$bin" predict "${base[@]}" --load m.st --data task \
    --eval-batch-size 16 --top-k 50 --output "pred.$np.csv" || { fail "predict at $np ranks: exit $?"; tail -5 "pred.$np.log"; }
done
for np in 2 4; do
  if cmp -s pred.1.csv "pred.$np.csv"; then echo "ok: predict at $np ranks = 1 rank, byte for byte"
  else fail "predict at $np ranks differs from 1 rank"; fi
done

# predict's rows go to the file as they are made, not gathered whole onto every rank. They were
# all-gathered: every rank held every rank's rows (padded) four to five times over (its rows, the
# gather's two buffers, the copies, the CSV), and a rank whose rows passed 2 GiB (1,900 images of
# 65536 classes at --top-k 65536) ended after its whole scoring with "collective count 2206399428
# out of range", exit 3. Rank 0 now writes its rows in pieces of 8 MiB as it scores, and each
# other rank's are sent to it piece by piece: at one rank, scoring 120 images at --top-k 65536
# (a CSV of about 140 MB) peaks within half the CSV's size of the same run at --top-k 1.
python3 - wide <<'PY'
import os, random, sys
def npy(path, shape, data, descr):
    head = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    head += " " * (63 - (10 + len(head)) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode() + data)
os.makedirs(sys.argv[1], exist_ok=True)
r = random.Random(7)
for split, n in (("train", 32), ("test", 120)):
    npy(f"{sys.argv[1]}/{split}_images.npy", (n, 16, 16, 1), bytes(r.randrange(256) for _ in range(n * 256)), "|u1")
    labels = [65535] + [r.randrange(65536) for _ in range(n - 1)]  # 65536 classes
    npy(f"{sys.argv[1]}/{split}_labels.npy", (n,), b"".join(v.to_bytes(2, "little") for v in labels), "<u2")
PY
run wide.log "${train[@]}" --data wide --epochs 1 --max-steps 1 --eval-every 0 --save wide.st ||
  fail "training the 65536-class model: exit $?"
peak() {  # peak KEEP OUT [mpirun args]: the run's peak resident memory in KiB (its exit status: 0)
  python3 - "$@" <<PY
import os, resource, subprocess, sys
keep, out, launch = sys.argv[1], sys.argv[2], sys.argv[3:]
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}  # meson's: it touches freed memory
rc = subprocess.run(launch + ["$bin", "predict", "--threads", "1", "--load", "wide.st", "--data", "wide",
                              "--top-k", keep, "--output", out], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, env=env).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else f"exit {rc}")
PY
}
small=$(peak 1 wide1.csv) big=$(peak 65536 wide.csv)
size=$(stat -c %s wide.csv 2>/dev/null || echo 0)
if [[ $small =~ ^[0-9]+$ && $big =~ ^[0-9]+$ ]] && ((size > 100000000 && (big - small) * 1024 < size / 2)); then
  echo "ok: --top-k 65536 (a CSV of $size bytes) peaked $(((big - small) / 1024)) MiB above --top-k 1"
else
  fail "--top-k 65536: peak $big KiB against $small KiB at --top-k 1, for a CSV of $size bytes"
fi
python3 - wide.csv wide/test_labels.npy <<'PY' || fail "wide.csv is not every image's 65536 classes"
import math, sys
rows = open(sys.argv[1]).read().split("\n")
assert rows[0] == "index,label," + ",".join(f"class{c},prob{c}" for c in range(1, 65537)), rows[0][:80]
labels = open(sys.argv[2], "rb").read()[-240:]
assert len(rows) == 122 and rows[-1] == "", len(rows)
for i, row in enumerate(rows[1:-1]):
    cells = row.split(",")
    assert cells[:2] == [str(i), str(int.from_bytes(labels[2 * i:2 * i + 2], "little"))], cells[:2]
    assert sorted(map(int, cells[2::2])) == list(range(65536)), i
    p = list(map(float, cells[3::2]))
    assert p == sorted(p, reverse=True) and math.isclose(sum(p), 1, rel_tol=1e-3), (i, sum(p))
print("ok: wide.csv holds 120 rows of the 65536 classes by decreasing probability, summing to 1")
PY
# At 2 ranks rank 1's rows (about 70 MB) reach rank 0 in pieces: the same file, byte for byte.
run wide2.log "${mpi[@]}" -np 2 "$bin" predict "${base[@]}" --load wide.st --data wide --top-k 65536 \
  --output wide2.csv || fail "predict --top-k 65536 at 2 ranks: exit $?"
cmp -s wide.csv wide2.csv && echo "ok: --top-k 65536 at 2 ranks = 1 rank, byte for byte" ||
  fail "--top-k 65536 at 2 ranks differs from 1 rank"
rm -f wide.csv wide1.csv wide2.csv
run pred5.log "$bin" predict "${base[@]}" --load m.st --data task --eval-batch-size 16 --output pred5.csv || fail "predict --top-k 5: exit $?"
# predict's probabilities against evaluate: top-1 and top-5 hits, and the loss as -log p(label).
if err=$(python3 - pred.1.csv pred5.csv eval.1.json task/t10k-labels-idx1-ubyte <<'PY'
import csv, json, math, sys
rows = list(csv.reader(open(sys.argv[1])))
five = list(csv.reader(open(sys.argv[2])))
e = json.load(open(sys.argv[3]))
labels = open(sys.argv[4], "rb").read()[8:]
assert len(rows[0]) == 2 + 2 * 10, "--top-k 50 is capped at the 10 classes: %s" % rows[0]
assert len(five[0]) == 2 + 2 * 5 and five[0][2:4] == ["class1", "prob1"], five[0]
body = rows[1:]
assert [int(r[0]) for r in body] == list(range(200)), "rows out of the data set's order"
assert [int(r[1]) for r in body] == list(labels), "labels"
top1 = top5 = 0
loss = 0.0
for r, f in zip(body, five[1:]):
    classes, probs = [int(c) for c in r[2::2]], [float(p) for p in r[3::2]]
    assert sorted(classes) == list(range(10)) and probs == sorted(probs, reverse=True), r
    assert abs(sum(probs) - 1) < 1e-4, sum(probs)
    assert f == r[:12], "--top-k 5 is the first 5 of 10"
    top1 += classes[0] == int(r[1])
    top5 += int(r[1]) in classes[:5]
    loss -= math.log(probs[classes.index(int(r[1]))])
assert top1 == e["top1_correct"] and top5 == e["top5_correct"], (top1, top5, e["top1_correct"], e["top5_correct"])
assert abs(loss / 200 - e["loss"]) < 1e-5, (loss / 200, e["loss"])
PY
); then echo "ok: predict's rows, probabilities, top-1, top-5 and loss agree with evaluate"
else fail "predict against evaluate: $err"; fi

# ---- refusals: flags, files, data that does not fit ----------------------------------------------
expect 2 "--epochs is not a flag of dptrain evaluate" -- "$bin" evaluate --load m.st --data task --epochs 3
expect 2 "--metrics is not a flag of dptrain predict" -- "$bin" predict --load m.st --data task --output x.csv --metrics x.json
expect 2 "--load is not a flag of dptrain" -- "$bin" --data task --load m.st
expect 2 "unknown command 'evalute'" -- "$bin" evalute --load m.st
expect 2 "dptrain evaluate needs --load FILE" -- "$bin" evaluate --data task
expect 2 "dptrain predict needs --output FILE" -- "$bin" predict --load m.st --data task
expect 0 "--load" -- "$bin" evaluate --help
if grep -qE -- "--(epochs|output|init-from) " "$tmp/out.txt"; then fail "evaluate --help lists flags it does not take"
else echo "ok: evaluate --help lists only its flags"; fi
expect 0 "--init-from" -- "$bin" --help
grep -qE -- "--load " "$tmp/out.txt" && fail "dptrain --help lists --load"
mkdir adir && mkfifo fifo && head -c 1000 m.st > trunc.st
for bad in missing.st adir fifo; do
  expect 2 "--load $bad" -- timeout 20 "$bin" evaluate --load "$bad" --data task
done
expect 2 "trunc.st" -- timeout 20 "$bin" evaluate --load trunc.st --data task
# A sparse 50 GB file whose header is m.st's: refused from its header, nothing of it read.
cp m.st sparse.st && truncate -s 50G sparse.st
expect 2 "sparse.st: $((50 * 2**30 - $(stat -c %s m.st))) trailing bytes after the last tensor: the file has $((50 * 2**30)) bytes, its header accounts for $(stat -c %s m.st)" -- \
  timeout 20 "$bin" evaluate --load sparse.st --data task
rm -f sparse.st
st_edit m.st nan.st fill fc2.bias=nan
expect 2 "nan.st: tensor 'fc2.bias' holds nan at element 0 (of 10)" -- "$bin" evaluate --load nan.st --data task
# A --load replaced while the run reads it (a training's next checkpoint renamed over the one
# being scored, another file put in its place): rank 0 reads the metadata first (the model, the
# class count, the normalisation), the data next, and the tensors last. The file is replaced here
# right after the metadata's reading (its second open and close, after the input check's; watched
# with inotify), by one of another step, other weights and another normalisation: the run scored
# the new tensors under the old file's normalisation and named neither, exit 0. Now exit 2. (On
# Fashion-MNIST, whose reading, some 0.5 s, leaves the watcher ample time to replace the file.)
fmnist=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}
run swap.train.log "${train[@]}" --data "$fmnist" --epochs 1 --max-steps 1 --eval-every 0 --save swap.st ||
  fail "training on $fmnist: exit $?"
st_edit swap.st swap2.st meta step=99 meta normalize_mean=0.5 meta normalize_std=0.25 fill fc2.bias=0.5
python3 - "$bin" "$fmnist" <<'PY' > swap.log 2>&1; swapped=$?
import ctypes, os, select, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
# IN_OPEN and IN_CLOSE_NOWRITE: alternating, so that the kernel never merges two closes into one
assert fd >= 0 and libc.inotify_add_watch(fd, b".", 0x20 | 0x10) >= 0
run = subprocess.Popen([sys.argv[1], "evaluate", "--threads", "1", "--load", "swap.st", "--data", sys.argv[2]],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
closes = 0
while closes < 2 and run.poll() is None and select.select([fd], [], [], 30)[0]:
    buf = os.read(fd, 65536)
    while buf:
        _, mask, _, n = struct.unpack_from("iIII", buf)
        closes += mask & 0x10 != 0 and buf[16:16 + n].rstrip(b"\0") == b"swap.st"
        buf = buf[16 + n:]
if closes == 2:
    os.rename("swap2.st", "swap.st")
out = run.communicate(timeout=60)[0].decode()
print(out, f"(replaced after {closes} closes)")
sys.exit(run.returncode)
PY
if [[ $swapped -eq 2 ]] && grep -qF "[rank 0@$(hostname)] error: --load swap.st changed while this run read it" swap.log; then
  echo "ok: a --load replaced between its metadata and its tensors is refused"
else
  fail "a --load replaced while read: exit $swapped: $(tail -3 swap.log)"
fi
# Every fc2 weight 1e30 and no bias: the 10 logits are one huge value, so the softmax is uniform,
# the loss ln 10 and every probability 0.1, the ties ranked from class 0 (the log-sum-exp,
# 1e31 + ln 10, rounded its log away: loss 0, probabilities 1). Weights that overflow the logits
# to inf are refused naming the image, and an older output stays as it was.
st_edit m.st huge.st fill fc2.weight=1e30 fill fc2.bias=0
run huge.log "$bin" evaluate --load huge.st --data task --metrics huge.json || fail "evaluate huge.st: exit $?"
run huge.pred.log "${mpi[@]}" -np 2 "$bin" predict --load huge.st --data task --eval-batch-size 16 --output huge.csv ||
  fail "predict huge.st: exit $?"
if err=$(python3 - huge.json huge.csv task/t10k-labels-idx1-ubyte 2>&1 <<'PY'
import json, math, sys
e = json.load(open(sys.argv[1]))
labels = open(sys.argv[3], "rb").read()[8:]
assert abs(e["loss"] - math.log(10)) < 1e-12, "loss %r, not ln 10" % e["loss"]
assert e["top1_correct"] == labels.count(0), (e["top1_correct"], labels.count(0))
rows = open(sys.argv[2]).read().splitlines()[1:]
want = ["%d,%d,0,0.1,1,0.1,2,0.1,3,0.1,4,0.1" % (i, l) for i, l in enumerate(labels)]
assert rows == want, "rows %s" % rows[:2]
PY
); then echo "ok: logits of 1e31 give a uniform softmax (loss ln 10, probabilities 0.1)"
else fail "logits of 1e31: $err"; fi
st_edit m.st ovf.st fill fc2.weight=1e38 fill fc2.bias=0
echo older > ovf.csv
expect 2 "error: --load ovf.st: the model's logit of class 0 for test image 0 is inf: its weights overflow float" -- \
  "${mpi[@]}" -np 2 "$bin" predict --load ovf.st --data task --eval-batch-size 16 --output ovf.csv
[[ $(cat ovf.csv) == older ]] && echo "ok: the refused predict left its --output as it was" || fail "ovf.csv: $(head -2 ovf.csv)"
expect 2 "--load ovf.st: the model's logit of class 0 for test image 0 is inf" -- "$bin" evaluate --load ovf.st --data task --metrics ovf.json
[[ -e ovf.json ]] && fail "a refused evaluate wrote --metrics"
# A negative BatchNorm running variance (finite, so not caught as NaN) scored every image as one
# class without a word: refused naming the tensor, for --load and --init-from.
syn=synthetic:8x8x3:32:4
run bn.log "$bin" --model resnet18-tv --data "$syn" --epochs 1 --max-steps 1 --batch-size 16 --eval-every 0 \
  --progress off --threads 1 --save bn.st || fail "training a resnet18-tv to edit: exit $?"
st_edit bn.st bnneg.st fill layer1.0.bn2.running_var=-0.5
expect 2 "bnneg.st: tensor 'layer1.0.bn2.running_var' holds -0.5 at element 0 (of 64): a running variance is never negative" -- \
  "$bin" evaluate --load bnneg.st --data "$syn"
expect 2 "bnneg.st: tensor 'layer1.0.bn2.running_var' holds -0.5 at element 0" -- \
  "$bin" --model resnet18-tv --data "$syn" --epochs 1 --max-steps 1 --batch-size 16 --init-from bnneg.st
st_edit m.st huge_shape.st meta input_shape=99999999999999999999,16,1
expect 2 "--load huge_shape.st: input_shape '99999999999999999999,16,1' is not H,W,C" -- \
  "$bin" evaluate --load huge_shape.st --data task
st_edit m.st comma_shape.st meta input_shape=16,16,1,
expect 2 "--load comma_shape.st: input_shape '16,16,1,' is not H,W,C" -- \
  "$bin" evaluate --load comma_shape.st --data task
# num_classes is read as every number is (read_number): sscanf's %lld took " 10" and "+10".
for classes in " 10" "+10" "10 " "0x0a" "10.0"; do
  st_edit m.st classes.st meta "num_classes=$classes"
  expect 2 "--load classes.st: num_classes '$classes' is not a class count" -- \
    "$bin" evaluate --load classes.st --data task
done
st_edit m.st plus_shape.st meta input_shape=16,+16,1
expect 2 "--load plus_shape.st: input_shape '16,+16,1' is not H,W,C" -- "$bin" evaluate --load plus_shape.st --data task
expect 2 "--output adir" -- timeout 20 "$bin" predict --load m.st --data task --output adir
expect 2 "--output fifo" -- timeout 20 "$bin" predict --load m.st --data task --output fifo
expect 2 "--metrics /dev/null is a character device" -- "$bin" evaluate --load m.st --data task --metrics /dev/null
# An output that is the --load file (by its name, through a symlink, or another spelling) or a
# data file would destroy that input: refused naming both, and the file left as it was.
cp m.st same.st && ln -s m.st linkload && cksum m.st same.st > sums.before
expect 2 "--output same.st is the file --load reads (same.st)" -- "$bin" predict --load same.st --data task --output same.st
expect 2 "--metrics ./same.st is the file --load reads (same.st)" -- "$bin" evaluate --load same.st --data task --metrics ./same.st
expect 2 "--output m.st is the file --load reads (linkload)" -- "$bin" predict --load linkload --data task --output m.st
expect 2 "--metrics task/t10k-labels-idx1-ubyte is the file --data reads" -- \
  "$bin" evaluate --load m.st --data task --metrics task/t10k-labels-idx1-ubyte
cksum m.st same.st | cmp -s - sums.before && echo "ok: the refused runs left --load as it was" ||
  fail "a refused run changed its --load file"
make_data seven --format idx --train 100 --test 20 --rows 16 --cols 16 --classes 7 --seed 3
make_data big --format idx --train 100 --test 20 --rows 20 --cols 20 --classes 10 --seed 3
expect 2 "--load m.st has 10 classes; --data seven has 7" -- "$bin" evaluate --load m.st --data seven
expect 2 "--load m.st takes images of 16x16x1 (HxWxC); --data big has images of 20x20x1" -- \
  "$bin" predict --load m.st --data big --output x.csv
st_edit m.st norm2.st meta normalize_mean=0.5,0.5 meta normalize_std=0.25,0.25
expect 2 "--load norm2.st normalises 2 channels (0.5,0.5/0.25,0.25); --data task has images of 1 channel" -- \
  "$bin" evaluate --load norm2.st --data task
# A stem recorded for LeNet (fixed stem) is the file's fault, not a --stem the user never gave.
st_edit m.st stem.st meta stem=cifar
expect 2 "--load stem.st: its metadata records the stem 'cifar' for a lenet model, whose stem is fixed" -- \
  "$bin" evaluate --load stem.st --data task
st_edit m.st nometa.st nometa
expect 2 "--load nometa.st: its metadata has no 'model'" -- "$bin" evaluate --load nometa.st --data task
# At 2 ranks too: every rank ends with exit 2.
expect 2 "has 10 classes; --data seven has 7" -- "${mpi[@]}" -np 2 "$bin" evaluate --load m.st --data seven

# ---- --init-from ----------------------------------------------------------------------------------
# One step at a rate far below any parameter's rounding step: the tensors after it are the file's.
still=(--epochs 1 --max-steps 1 --lr 1e-30 --momentum 0 --weight-decay 0 --schedule constant --warmup-epochs 0)
for np in 1 2; do
  run "init.$np.log" "${mpi[@]}" -np "$np" "${train[@]}" --data task "${still[@]}" --init-from m.st --save "init.$np.st" ||
    { fail "--init-from at $np ranks: exit $?"; tail -5 "init.$np.log"; }
  if same_tensors m.st "init.$np.st" > /dev/null; then echo "ok: --init-from at $np ranks starts from the file's tensors"
  else fail "--init-from at $np ranks: $(same_tensors m.st "init.$np.st")"; fi
done
run scratch.log "${train[@]}" --data task "${still[@]}" --save scratch.st
same_tensors m.st scratch.st > /dev/null && fail "the same run without --init-from also ends at the file's tensors"
# Any safetensors file with the names and shapes (no metadata) does too.
run foreign.log "${train[@]}" --data task "${still[@]}" --init-from nometa.st --save foreign.st ||
  fail "--init-from a file without metadata: exit $?"
same_tensors m.st foreign.st > /dev/null || fail "--init-from a file without metadata: other tensors"
# Another class count: the head starts afresh (named in the log), every other tensor is the file's.
make_data five --format idx --train 200 --test 40 --rows 16 --cols 16 --classes 10 --seed 8 --levels-seed 7 --relabel 5 --learnable
run head.log "${train[@]}" --data five "${still[@]}" --init-from m.st --save head.st || fail "--init-from, 5 classes: exit $?"
grep -qF "the classifier head is re-initialised for 5 classes: fc2.weight [10, 128] -> [5, 128], fc2.bias [10] -> [5]" head.log &&
  echo "ok: the re-initialised head is logged" || fail "no log line of the re-initialised head: $(grep -i init-from head.log)"
same_tensors m.st head.st --except fc2. > /dev/null || fail "--init-from, 5 classes: $(same_tensors m.st head.st --except fc2.)"
st_edit m.st conv.st shape conv1.weight=20,1,5,5
expect 2 "conv.st: tensor 'conv1.weight' has shape [20, 1, 5, 5], lenet needs [20, 1, 3, 3]" -- \
  "${train[@]}" --data task "${still[@]}" --init-from conv.st
st_edit m.st head3.st shape fc2.weight=10,64
expect 2 "head3.st: tensor 'fc2.weight' has shape [10, 64], lenet needs [10, 128]" -- \
  "${train[@]}" --data task "${still[@]}" --init-from head3.st
expect 2 "m.st: was trained on images of 16,16,1 (H,W,C), this run's data has 20,20,1" -- \
  "${mpi[@]}" -np 2 "${train[@]}" --data big "${still[@]}" --init-from m.st
# Ranks must agree on starting from a file (rank 0 reads it; the others take its broadcast).
expect 2 "ranks were started with different --init-from: rank 0 has (given); rank 1 has (not given)" -- \
  "${mpi[@]}" -np 1 "${train[@]}" --data task "${still[@]}" --init-from m.st : -np 1 "${train[@]}" --data task "${still[@]}"
expect 2 "ranks were started with different --top-k" -- \
  "${mpi[@]}" -np 1 "$bin" predict --load m.st --data task --output x.csv --top-k 3 : -np 1 "$bin" predict --load m.st --data task --output x.csv
expect 2 "--init-from and --resume exclude each other" -- "${train[@]}" --data task --init-from m.st --resume m.st
for bad in missing.st adir fifo; do
  expect 2 "--init-from $bad" -- timeout 20 "${train[@]}" --data task "${still[@]}" --init-from "$bad"
done
expect 2 "trunc.st" -- timeout 20 "${train[@]}" --data task "${still[@]}" --init-from trunc.st
# A non-finite weight is refused before the first step, not at the final --save.
st_edit m.st inf.st fill conv1.weight=-inf
expect 2 "inf.st: tensor 'conv1.weight' holds -inf at element 0" -- \
  "${train[@]}" --data task "${still[@]}" --init-from inf.st --save inf.out.st

# ---- fine-tuning beats training from scratch -----------------------------------------------------
# Task A: 10 classes told apart by colour level and stripe period; task B: other images with the
# same classes' looks, labelled k mod 5 (5 classes, each the union of two of A's). A's features
# decide B, so one epoch of B from A's model is far ahead of one from scratch (measured: 0.72-0.85
# against 0.33-0.42 test accuracy at seeds 1-4).
run a.log "${train[@]}" --data task --epochs 4 --save a.st || fail "training task A: exit $?"
make_data taskb --format idx --train 1600 --test 200 --rows 16 --cols 16 --classes 10 --seed 8 --levels-seed 7 --relabel 5 --learnable
tune=(--epochs 1 --lr 0.02 --schedule constant --warmup-epochs 0)
for seed in 1 2 3; do
  run "b.scratch.$seed.log" "${train[@]}" --data taskb "${tune[@]}" --seed "$seed" --metrics "b.scratch.$seed.jsonl"
  run "b.tuned.$seed.log" "${train[@]}" --data taskb "${tune[@]}" --seed "$seed" --init-from a.st --metrics "b.tuned.$seed.jsonl"
  if err=$(python3 - "b.scratch.$seed.jsonl" "b.tuned.$seed.jsonl" <<'PY'
import json, sys
acc = [json.loads(open(p).readlines()[-1])["test_acc"] for p in sys.argv[1:]]
print("scratch %.3f, fine-tuned %.3f" % tuple(acc))
sys.exit(0 if acc[1] > acc[0] + 0.2 else 1)
PY
  ); then echo "ok: seed $seed: $err"; else fail "fine-tuning at seed $seed is not 0.2 ahead: $err"; fi
done

# ---- evaluate's confusion matrix and top-5, counted from the labels file and predict's rows --------
# Rows are the true class: row t holds the images labelled t (per_class_count), each in the column
# predict ranks first for it; top-5 hits are the images whose label is among predict's first five.
# For the trained model and for one near chance (scratch.st: its initial weights), where the label
# is often 5th or lower.
run scratch.eval.log "$bin" evaluate "${base[@]}" --load scratch.st --data task --metrics scratch.json ||
  fail "evaluate scratch.st: exit $?"
run scratch.pred.log "$bin" predict "${base[@]}" --load scratch.st --data task --top-k 10 --output scratch.csv ||
  fail "predict scratch.st: exit $?"
for model in m scratch; do
  json=eval.1.json csv=pred.1.csv
  [[ $model == scratch ]] && json=scratch.json csv=scratch.csv
  if err=$(python3 - "$json" "$csv" task/t10k-labels-idx1-ubyte 2>&1 <<'PY'
import csv, json, sys
e = json.load(open(sys.argv[1]))
rows = list(csv.reader(open(sys.argv[2])))[1:]
labels = open(sys.argv[3], "rb").read()[8:]
want = [[0] * 10 for _ in range(10)]
top5 = 0
for r in rows:
    label, classes = labels[int(r[0])], [int(c) for c in r[2::2]]
    want[label][classes[0]] += 1
    top5 += label in classes[:5]
assert e["per_class_count"] == [labels.count(t) for t in range(10)], e["per_class_count"]
assert e["confusion"] == want, "confusion %s, counted %s" % (e["confusion"], want)
assert e["top5_correct"] == top5, "top-5 %d, counted %d" % (e["top5_correct"], top5)
print("top-1 %d, top-5 %d of 200" % (e["top1_correct"], top5))
PY
  ); then echo "ok: $model: evaluate's confusion matrix (rows true, columns predicted) and top-5: $err"
  else fail "$model: evaluate's confusion matrix or top-5: $err"; fi
done

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
