#!/usr/bin/env bash
# Ranks started with different settings, and resumes with other settings than the checkpoint's:
# each case must end with exit 2 and a message naming the flag (and the ranks), never train two
# different things, crash in a collective or wait out --timeout. Each run is bounded by `timeout`.
# Usage: test_agreement.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
short=(--epochs 1 --max-steps 2 --eval-every 0 --timeout 60)
cd "$tmp" || exit 1

# two FLAGS0... : FLAGS1...: sets CMD to two ranks, each with its own flags (an MPMD line, as a
# stale copy of a job script would make).
two() {
  local a=()
  while [[ $1 != : ]]; do a+=("$1"); shift; done
  shift
  CMD=("${mpi[@]}" -np 1 "$bin" "${short[@]}" "${a[@]}" : -np 1 "$bin" "${short[@]}" "$@")
}

echo "== ranks started with different settings"
two : --lr 0.1
expect 2 "ranks were started with different --lr: rank 0 has 0.05; rank 1 has 0.1" -- "${CMD[@]}"
two --seed 1 : --seed 2
expect 2 "different --seed" -- "${CMD[@]}"
# Without the check: rank 0 sends 128 images' worth, rank 1 expects 64 (MPI_ERR_TRUNCATE or a hang).
two --batch-size 128 : --batch-size 256
expect 2 "different --batch-size" -- "${CMD[@]}"
two : --momentum 0.5
expect 2 "different --momentum" -- "${CMD[@]}"
two --model resnet18 --batch-size 4 --sync-bn : --model resnet18 --batch-size 4
expect 2 "different --sync-bn" -- "${CMD[@]}"
two --eval-every 1 : --eval-every 0
expect 2 "different --eval-every" -- "${CMD[@]}"
# The recipe options (issue 32): each shapes the trajectory, so each is agreed.
two : --optimizer adamw
expect 2 'different --optimizer: rank 0 has "sgd"; rank 1 has "adamw"' -- "${CMD[@]}"
two --optimizer adamw : --optimizer adamw --betas 0.9,0.99
expect 2 "different --betas: rank 0 has [0.9,0.999]; rank 1 has [0.9,0.99]" -- "${CMD[@]}"
two --optimizer adamw : --optimizer adamw --eps 1e-6
expect 2 "different --eps" -- "${CMD[@]}"
two : --nesterov
expect 2 "different --nesterov: rank 0 has false; rank 1 has true" -- "${CMD[@]}"
two --no-decay-bn-bias :
expect 2 "different --no-decay-bn-bias: rank 0 has true; rank 1 has false" -- "${CMD[@]}"
two : --label-smoothing 0.1
expect 2 "different --label-smoothing: rank 0 has 0.0; rank 1 has 0.1" -- "${CMD[@]}"
# torch.optim.SGD refuses Nesterov without momentum: so does every rank, the flag named.
expect 2 "--nesterov needs --momentum > 0" -- "${mpi[@]}" -np 2 "$bin" "${short[@]}" --recipe d2l --nesterov
# Only rank 0 would write --save, but every rank takes part in its barrier: presence must agree.
two --save "$tmp/s.st" :
expect 2 "different --save: rank 0 has (given); rank 1 has (not given)" -- "${CMD[@]}"
# A flag only one rank has wrong ends every rank (rank 1 alone returned 2, rank 0 waited in the
# pre-flight's first collective for ever), that rank saying why.
two : --lr -1
EXPECT_TIMEOUT=60 expect 2 "error: --lr must be >= 0, got -1" -- "${CMD[@]}"
grep -qF "[rank 1@" "$tmp/out.txt" || fail "the flag error does not name rank 1"
# The settings are compared before any collective that depends on one: the bf16 CPU check, a
# collective only bf16 ranks joined, met the fp32 rank's next one (exit 3, MPI_ERR_TRUNCATE).
two --precision bf16 : --precision fp32
expect 2 'different --precision: rank 0 has "bf16"; rank 1 has "fp32"' -- "${CMD[@]}"
two --precision fp32 : --precision bf16
expect 2 'different --precision: rank 0 has "fp32"; rank 1 has "bf16"' -- "${CMD[@]}"
# --device as given: an explicit cuda beside a cpu rank was quietly made cpu (or, here without a
# GPU, said "no CUDA device visible"); only auto resolves on a mix of ranks.
two --device cuda : --device cpu
expect 2 'different --device: rank 0 has "cuda"; rank 1 has "cpu"' -- "${CMD[@]}"
two --device auto : --device cpu
expect 2 'different --device: rank 0 has "auto"; rank 1 has "cpu"' -- "${CMD[@]}"
# One rank whose CPU lacks bf16 (DPT_CPU_BF16=off on it alone) ends every rank, that rank saying why.
CMD=("${mpi[@]}" -np 1 "$bin" "${short[@]}" --precision bf16 : -np 1 env DPT_CPU_BF16=off "$bin" "${short[@]}" \
  --precision bf16)
expect 2 "--precision bf16 on the CPU needs AVX512-BF16 or AMX-BF16" -- "${CMD[@]}"
expect 2 "ranks 1,2 have" -- "${mpi[@]}" -np 1 "$bin" "${short[@]}" --batch-size 12 --seed 5 : \
  -np 2 "$bin" "${short[@]}" --batch-size 12
# The same data set at another path is fine; a copy with one label changed is not.
mkdir -p "$tmp/copy" "$tmp/bad"
cp /usr/share/datasets/fashion-mnist/* "$tmp/copy/"
cp /usr/share/datasets/fashion-mnist/* "$tmp/bad/"
python3 - "$tmp/bad/t10k-labels-idx1-ubyte.gz" <<'PY'
import gzip, sys
d = bytearray(gzip.open(sys.argv[1]).read())
d[-1] = (d[-1] + 1) % 10
gzip.open(sys.argv[1], "wb").write(bytes(d))
PY
two : --data "$tmp/copy"
expect 0 "epoch 1/1" -- "${CMD[@]}"
two : --data "$tmp/bad"
expect 2 "different --data (test set)" -- "${CMD[@]}"

echo "== ranks running different dptrain builds"
# A stale copy on one host (a build of another commit) with the same flags trained without a word:
# the collectives assume one build, and another optimizer or kernel drifts the replicas apart. A
# copy of the binary whose revision string is changed (same length) stands for the other build.
rev=$("$bin" --version | sed -n 's/^dptrain [^ ]* (git \(.*\))$/\1/p')
other=$tmp/dptrain-other
if python3 - "$bin" "$other" "$rev" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
rev = sys.argv[3].encode() + b"\0"
if not sys.argv[3] or data.count(rev) != 1:
    sys.exit(1)
new = bytes([rev[0] ^ 1]) + rev[1:]  # another first character, same length
open(sys.argv[2], "wb").write(data.replace(rev, new))
PY
then
  chmod +x "$other"
  CMD=("${mpi[@]}" -np 1 "$bin" "${short[@]}" : -np 1 "$other" "${short[@]}")
  expect 2 "ranks were started with different dptrain builds: rank 0 has 0." -- "${CMD[@]}"
  grep -qF "every rank must run the same dptrain binary" "$tmp/out.txt" ||
    fail "the different builds are not named as such"
  CMD=("${mpi[@]}" -np 1 "$bin" "${short[@]}" : -np 1 "$bin" "${short[@]}")
  expect 0 "epoch 1/1" -- "${CMD[@]}"
else
  echo "skip: the revision string '$rev' is not once in $bin"
fi

echo "== ranks started with different commands, or outputs on one rank only"
# Each command issues its own collectives: before the check, evaluate against predict ended in
# std::bad_alloc and ORTE's "read past end of buffer", train against evaluate in MPI_ERR_TRUNCATE.
syn=synthetic:28x28x1:512:10
"$bin" --data $syn --epochs 1 --max-steps 2 --eval-every 0 --save "$tmp/m.st" > /dev/null 2>&1
CMD=("${mpi[@]}" -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn : -np 1 "$bin" predict --load "$tmp/m.st" --data $syn --output "$tmp/p.csv")
expect 2 "the ranks were started with different commands (rank 0 evaluate, rank 1 predict)" -- "${CMD[@]}"
CMD=("${mpi[@]}" -np 1 "$bin" --data $syn "${short[@]}" : -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn)
expect 2 "different commands (rank 0 train, rank 1 evaluate)" -- "${CMD[@]}"
# Output paths are rank 0's, as in training: evaluate's --metrics on one rank only waited out
# --timeout, then blamed the other rank.
CMD=("${mpi[@]}" -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn --metrics "$tmp/r0.json" --timeout 20 : -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn --timeout 20)
expect 0 "top-1" -- "${CMD[@]}"
[[ -s $tmp/r0.json ]] || fail "rank 0's --metrics was not written"
CMD=("${mpi[@]}" -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn --timeout 20 : -np 1 "$bin" evaluate --load "$tmp/m.st" --data $syn --metrics "$tmp/r1.json" --timeout 20)
expect 0 "top-1" -- "${CMD[@]}"
[[ ! -e $tmp/r1.json ]] || fail "rank 1's --metrics was written"

echo "== resuming with other settings than the checkpoint's"
"$bin" --epochs 2 --max-steps 4 --eval-every 0 --checkpoint-every 1 --checkpoint-path "$tmp/c.st" --quiet \
  > /dev/null 2>&1 || { echo "FAIL: could not write the checkpoint"; fails=$((fails + 1)); }
"$bin" --epochs 1 --max-steps 4 --eval-every 0 --checkpoint-every 1 --checkpoint-path "$tmp/e1.st" --quiet \
  > /dev/null 2>&1 || { echo "FAIL: could not write the epoch-1 checkpoint"; fails=$((fails + 1)); }
expect 2 "--lr 0.05 -> 0.2" -- "$bin" --epochs 2 --max-steps 4 --eval-every 0 --lr 0.2 --resume "$tmp/c.st"
expect 2 "--epochs 1 -> 3" -- "$bin" --epochs 3 --max-steps 4 --eval-every 0 --resume "$tmp/e1.st"
expect 2 "--max-steps 4 -> 2" -- "$bin" --epochs 1 --max-steps 2 --eval-every 0 --resume "$tmp/e1.st"
expect 2 "--label-smoothing 0.0 -> 0.1" -- "$bin" --epochs 1 --max-steps 4 --eval-every 0 --label-smoothing 0.1 \
  --resume "$tmp/e1.st"
expect 2 "--nesterov false -> true" -- "$bin" --epochs 1 --max-steps 4 --eval-every 0 --nesterov --resume "$tmp/e1.st"
# Another optimizer: refused, and not accepted by --allow-config-change (its state is not there).
expect 2 "holds the state of --optimizer sgd, this run's is adamw: the optimizer cannot change on resume" \
  -- "$bin" --epochs 1 --max-steps 4 --eval-every 0 --optimizer adamw --allow-config-change --resume "$tmp/e1.st"
# Outputs and checks may change; the trajectory may not.
expect 0 "resumed from" -- "$bin" --epochs 1 --max-steps 4 --eval-every 1 --metrics-every 1 --resume "$tmp/e1.st"
# An explicit change: accepted, named, and the position recomputed in the new units (epoch 2 of 3,
# from its start: the epoch-1 checkpoint has 0 steps of epoch 2 done; 4 steps an epoch -> 4).
expect 0 "continuing at epoch 2, step 0 (global step 4)" -- "$bin" --epochs 3 --max-steps 4 --eval-every 0 \
  --allow-config-change --resume "$tmp/e1.st"
expect 0 "--batch-size 256 -> 128" -- "$bin" --epochs 1 --max-steps 4 --eval-every 0 --batch-size 128 \
  --allow-config-change --resume "$tmp/e1.st"

# edit SRC DST KEY [VALUE]: DST is SRC with metadata KEY set to VALUE, or without KEY when no value
# is given (the header is JSON after an 8-byte length; DST may be SRC).
edit() {
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, key, *value = sys.argv[1:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
if value: head["__metadata__"][key] = value[0]
else: head["__metadata__"].pop(key, None)
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
}

echo "== resuming on other data than the checkpoint's"
# A checkpoint records its data's digests: other images of the same shape, even at the same path,
# are a change like any other (exit 2 naming the file and the set; logged with
# --allow-config-change), and --normalize auto goes on with the recorded statistics, not the new
# data's. Before: exit 0 without a word, the statistics recomputed.
make_data() { python3 "$lib_dir/../data/make_data.py" "$@" > /dev/null || fail "make_data.py $*"; }
make_data "$tmp/d1" --format idx --train 128 --test 64 --rows 28 --cols 28 --channels 1 --classes 10 --seed 1
make_data "$tmp/d2" --format idx --train 128 --test 64 --rows 28 --cols 28 --channels 1 --classes 10 --seed 2
cp -r "$tmp/d1" "$tmp/data"
nd=("$bin" --epochs 2 --max-steps 2 --batch-size 32 --eval-every 0 --data "$tmp/data" --normalize auto
    --checkpoint-every 1 --keep-checkpoints 2 --checkpoint-path "$tmp/nd.st")
if run "$tmp/nd.log" "${nd[@]}"; then
  mean=$(meta_of normalize_mean "$tmp/nd.step2.st")
  [[ $(meta_of data_digest_train "$tmp/nd.step2.st") == "images 128 of 28x28x1, checksum 0x"* ]] ||
    fail "the checkpoint records no training-set digest"
  expect 0 "resumed from" -- "${nd[@]}" --resume "$tmp/nd.step2.st"
  cp "$tmp/d2"/* "$tmp/data/"
  expect 2 "nd.step2.st: the checkpoint was written with other training settings or data (--data (training set) images 128 of 28x28x1" \
    -- "${nd[@]}" --resume "$tmp/nd.step2.st"
  expect 0 "--allow-config-change: resuming $tmp/nd.step2.st with --data (training set)" -- "${nd[@]}" \
    --resume "$tmp/nd.step2.st" --allow-config-change
  grep -qF -- "--normalize auto: continuing with the statistics the checkpoint recorded ($mean/" "$tmp/out.txt" ||
    fail "the resume does not say it keeps the recorded statistics $mean"
  [[ $(meta_of normalize_mean "$tmp/nd.step4.st") == "$mean" ]] ||
    fail "--normalize auto recomputed on resume: $(meta_of normalize_mean "$tmp/nd.step4.st") against the recorded $mean"
  # A checkpoint from before digests were recorded still resumes, with a warning.
  edit "$tmp/nd.step2.st" "$tmp/old.st" data_digest_train && edit "$tmp/old.st" "$tmp/old.st" data_digest_test
  expect 0 "records no digest of the data it was trained on" -- "${nd[@]}" --resume "$tmp/old.st"
else
  fail "the --normalize auto run to resume: exit $?"; tail -5 "$tmp/nd.log"
fi

echo "== checkpoint metadata out of range"
edit "$tmp/c.st" "$tmp/neg.st" epoch -2147483169
expect 2 "metadata 'epoch' is -2147483169, outside [0, 1000000]" -- "$bin" --epochs 2 --max-steps 4 --resume "$tmp/neg.st"
edit "$tmp/c.st" "$tmp/huge.st" step 99999999999999999
expect 2 "metadata 'step' is 99999999999999999" -- "$bin" --epochs 2 --max-steps 4 --resume "$tmp/huge.st"
edit "$tmp/c.st" "$tmp/opt.st" optimizer_steps -1
expect 2 "metadata 'optimizer_steps' is -1" -- "$bin" --epochs 2 --max-steps 4 --resume "$tmp/opt.st"
edit "$tmp/c.st" "$tmp/cfg.st" config '{not json'
expect 2 "metadata 'config' is not valid JSON" -- "$bin" --epochs 2 --max-steps 4 --resume "$tmp/cfg.st"
# Metadata values are JSON text inside the header's strings, so the header's nesting bound did not
# reach them: a 'config' whose lr is an array nested a million deep, or a 'history' holding one,
# parsed, and printing the value (to compare it, or to read the record) recursed once per level:
# the resume died of a stack overflow (SIGSEGV, exit 139), also under --resume auto beside another
# training's file. Now exit 2 naming the file and the key. (Written by Python: a 2 MB value cannot
# be passed as one argument.)
mkdir -p "$tmp/auto"
python3 - "$tmp/c.st" "$tmp" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
deep = "[" * 1000000 + "]" * 1000000
def write(name, key, value, training=None):
    head = json.loads(raw[8:8 + n])
    head["__metadata__"][key] = value
    if training: head["__metadata__"]["training_id"] = training
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    open(f"{sys.argv[2]}/{name}", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
config = json.loads(json.loads(raw[8:8 + n])["__metadata__"]["config"])
write("deep_cfg.st", "config", json.dumps(dict(config, lr="@")).replace('"@"', deep))
write("deep_hist.st", "history", "[" + deep + "]")
write("auto/ck.step9.st", "config", json.dumps(dict(config, lr="@")).replace('"@"', deep), "0123456789abcdef")
PY
expect 2 "deep_cfg.st: metadata 'config' is not valid JSON (it nests deeper than 16)" -- \
  "$bin" --epochs 2 --max-steps 4 --resume "$tmp/deep_cfg.st"
expect 2 "deep_hist.st: metadata 'history' is not a list of epoch records" -- \
  "$bin" --epochs 2 --max-steps 4 --resume "$tmp/deep_hist.st"
cp "$tmp/c.st" "$tmp/auto/ck.step4.st"
expect 0 "passed over the files of other trainings ($tmp/auto/ck.step9.st)" -- "$bin" --epochs 2 --max-steps 4 \
  --eval-every 0 --checkpoint-every 1 --keep-checkpoints 5 --checkpoint-path "$tmp/auto/ck.st" --resume auto
# Under mpirun: rank 0 reads and says why; the job ends with 2, not an abort.
expect 2 "outside [0, 1000000]" -- "${mpi[@]}" -np 2 "$bin" --epochs 2 --max-steps 4 --resume "$tmp/neg.st"

echo "== --allow-config-change part-way through an epoch: the position in the new batch's steps"
# A checkpoint at step 2 of batch 64 (128 images done) resumed at batch 32 continues at step 4 of
# the epoch, global step 4: its steps are global steps 5..8, at the warm-up's rates for them
# (lr (step) / 8 over 8 steps an epoch).
sched=(--epochs 1 --eval-every 0 --lr 0.08 --warmup-epochs 1 --schedule constant --threads 1)
mkdir -p "$tmp/mid"
"$bin" "${sched[@]}" --max-steps 4 --batch-size 64 --checkpoint-every 2steps --keep-checkpoints 9 \
  --checkpoint-path "$tmp/mid/ck.st" --quiet > /dev/null 2>&1 || fail "could not write the mid-epoch checkpoint"
expect 0 "continuing at epoch 1, step 4 (global step 4)" -- "$bin" "${sched[@]}" --max-steps 8 --batch-size 32 \
  --allow-config-change --resume "$tmp/mid/ck.step2.st" --metrics "$tmp/mid/m.jsonl" --metrics-every 1
python3 - "$tmp/mid/m.jsonl" <<'PY' || fail "the run resumed at batch 32 did not take global steps 5..8 at their rates"
import json, math, sys
s = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
assert [r["step"] for r in s] == [5, 6, 7, 8], [r["step"] for r in s]
for r in s:
    assert math.isclose(r["lr"], 0.08 * r["step"] / 8, rel_tol=1e-6), (r["step"], r["lr"])
print("ok: resumed at batch 32: global steps 5..8 at the warm-up's rates")
PY
# The images of a step are --batch-size x --accum-steps: 2 steps of 32 x 2 are 128 images done,
# step 4 at batch 32 without accumulation.
"$bin" "${sched[@]}" --max-steps 4 --batch-size 32 --accum-steps 2 --checkpoint-every 2steps \
  --keep-checkpoints 9 --checkpoint-path "$tmp/mid/acc.st" --quiet > /dev/null 2>&1 || fail "could not write the accumulated checkpoint"
expect 0 "continuing at epoch 1, step 4 (global step 4)" -- "$bin" "${sched[@]}" --max-steps 8 --batch-size 32 \
  --allow-config-change --resume "$tmp/mid/acc.step2.st"
# And on the images those steps take in the epoch's order (128..255): at a rate of 1e-30 the
# parameters stay as they started, so each step's loss is its images' loss, and the resumed steps
# 5..8 must have a fresh batch-32 run's losses of steps 5..8 (not of 1..4, from the epoch's start).
still=(--epochs 1 --eval-every 0 --lr 1e-30 --schedule constant --threads 1 --metrics-every 1 --quiet)
"$bin" "${still[@]}" --max-steps 4 --batch-size 64 --checkpoint-every 2steps --keep-checkpoints 9 \
  --checkpoint-path "$tmp/mid/still.st" > /dev/null 2>&1 || fail "could not write the still checkpoint"
"$bin" "${still[@]}" --max-steps 8 --batch-size 32 --allow-config-change --resume "$tmp/mid/still.step2.st" \
  --metrics "$tmp/mid/still_resumed.jsonl" > /dev/null 2>&1 || fail "the still run did not resume at batch 32"
"$bin" "${still[@]}" --max-steps 8 --batch-size 32 --metrics "$tmp/mid/still_fresh.jsonl" > /dev/null 2>&1 \
  || fail "the fresh still run failed"
python3 - "$tmp/mid/still_resumed.jsonl" "$tmp/mid/still_fresh.jsonl" <<'PY' ||
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r["type"] == "step"}
resumed, fresh = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(resumed) == [5, 6, 7, 8], sorted(resumed)
assert all(resumed[s] == fresh[s] for s in resumed), (resumed, fresh)
print("ok: resumed at batch 32, steps 5..8 take the epoch's images 128..255")
PY
  fail "the run resumed at batch 32 did not continue the epoch's data order"

# At a larger batch the epoch's images done are fewer, larger steps, but the optimizer has taken
# the steps it took: 4 steps of batch 32 resumed at batch 64 continue at global step 2, and after
# global step 3 the optimizer has taken 4 + 1 steps. That checkpoint resumes as any other (it was
# refused, "'optimizer_steps' is 5, outside [0, 3]"), and the count goes on from 5: at step 4, 6
# (step 4's file is removed first, so the count read is the resumed run's own).
big=(--epochs 1 --eval-every 0 --threads 1 --keep-checkpoints 9)
"$bin" "${big[@]}" --max-steps 8 --batch-size 32 --checkpoint-every 4steps --checkpoint-path "$tmp/mid/small.st" \
  > /dev/null 2>&1 || fail "could not write the batch-32 checkpoint"
"$bin" "${big[@]}" --max-steps 4 --batch-size 64 --checkpoint-every 1steps --checkpoint-path "$tmp/mid/large.st" \
  --allow-config-change --resume "$tmp/mid/small.step4.st" > /dev/null 2>&1 || fail "could not resume at batch 64"
[[ $(meta_of step "$tmp/mid/large.step3.st"),$(meta_of optimizer_steps "$tmp/mid/large.step3.st") == 3,5 ]] ||
  fail "large.step3.st: step $(meta_of step "$tmp/mid/large.step3.st"), optimizer_steps $(meta_of optimizer_steps "$tmp/mid/large.step3.st"); want 3, 5"
rm -f "$tmp/mid/large.step4.st"
expect 0 "resumed from $tmp/mid/large.step3.st at epoch 1, step 3 (global step 3)" -- "$bin" "${big[@]}" \
  --max-steps 4 --batch-size 64 --checkpoint-every 1steps --checkpoint-path "$tmp/mid/large.st" \
  --resume "$tmp/mid/large.step3.st"
[[ $(meta_of optimizer_steps "$tmp/mid/large.step4.st") == 6 ]] ||
  fail "large.step4.st records $(meta_of optimizer_steps "$tmp/mid/large.step4.st") optimizer steps, not 4 + 1 + 1"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
