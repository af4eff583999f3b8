#!/usr/bin/env bash
# Checkpoints that cannot go backwards: --checkpoint-every in epochs, steps or minutes; the newest K
# kept, named by step; --resume auto takes the newest valid one by the step it records (not by its
# name), falls back past a corrupt one with a warning, starts fresh (saying so) when there is none;
# a killed writer's temporary file is removed at the next start (each logged once); an
# auto-resumed run ends bit for bit where an uninterrupted one ends, with float and with 16-bit
# activations (and under --precision bf16, where auto gives bf16 and a resume keeps the type it was
# trained in), with AdamW or Nesterov SGD (the optimizer itself cannot change on resume); a
# checkpoint's text is quoted escaped and cut, long lists of files summarised (junk in step order), and an id-less
# checkpoint or an empty file is replaced by a fresh run only with a warning; an epoch resumed
# part-way records the whole epoch. Usage:
# test_checkpoints.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
mpi+=(-np 2)
cd "$tmp" || exit 1
step_of() { meta_of step "$1"; }  # the step a checkpoint records in its metadata
base=(--epochs 3 --max-steps 5 --eval-every 0 --batch-size 64)

echo "== every 2 steps and at the end, the newest 3 kept, named by step (2 ranks)"
run a.log "${mpi[@]}" "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path run/ck.st \
  || true  # run/ does not exist: refused before the first step
grep -q "run/ck.st: the directory run does not exist" a.log || fail "a missing checkpoint directory was not refused"
mkdir run
run a.log "${mpi[@]}" "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path run/ck.st \
  --save full.st || fail "the run failed: $(tail -2 a.log)"
# Step 15, the last, is not a multiple of 2: written at the end anyway, so the same command run
# again (--resume auto) finds the training finished instead of training step 15 again.
[[ $(ls run) == $'ck.step12.st\nck.step14.st\nck.step15.st' ]] || fail "want ck.step12.st, ck.step14.st and ck.step15.st, have: $(ls run | tr '\n' ' ')"
[[ $(grep -c "checkpoint written" a.log) -eq 8 ]] || fail "want 8 checkpoints (steps 2..14, 15), got $(grep -c 'checkpoint written' a.log)"
run a2.log "${mpi[@]}" "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path run/ck.st \
  --resume auto || fail "the same command run again failed: $(tail -2 a2.log)"
grep -q "nothing is left to train" a2.log || fail "run again after its end: no 'nothing is left to train': $(grep -i resum a2.log)"
grep -q "checkpoint written" a2.log && fail "run again after its end, it wrote a checkpoint"
[[ $(step_of run/ck.step14.st) == 14 ]] || fail "ck.step14.st records step $(step_of run/ck.step14.st)"

echo "== --resume auto: the newest by recorded step, not by name; bit for bit at the end"
mkdir auto && cp run/ck.step12.st auto/ck.step99.st && cp run/ck.step14.st auto/ck.step1.st
run b.log "${mpi[@]}" "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path auto/ck.st \
  --resume auto --save resumed.st || fail "the auto resume failed: $(tail -2 b.log)"
grep -q "resumed from auto/ck.step1.st at epoch 3, step 4 (global step 14)" b.log \
  || fail "did not resume from the file recording step 14: $(grep -i resum b.log)"
same_tensors full.st resumed.st || fail "the auto-resumed run does not end where the uninterrupted one ends"

echo "== 16-bit activations (--activation-dtype bf16): resumed bit for bit; resumed as fp32: refused"
b16=(--epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 --activation-dtype bf16)
mkdir b16
run h.log "${mpi[@]}" "$bin" "${b16[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path b16/ck.st \
  --save full16.st || fail "the bf16-activation run failed: $(tail -2 h.log)"
run i.log "${mpi[@]}" "$bin" "${b16[@]}" --resume b16/ck.step4.st --save resumed16.st \
  || fail "the bf16-activation resume failed: $(tail -2 i.log)"
same_tensors full16.st resumed16.st || fail "the resumed bf16-activation run does not end where the uninterrupted one ends"
run j.log "${mpi[@]}" "$bin" "${b16[@]:0:8}" --activation-dtype fp32 --save float.st || fail "the float run failed"
same_tensors float.st full16.st >/dev/null 2>&1 && fail "bf16 activations gave the float run's bits: nothing was rounded"
expect 2 "--activation-dtype \"bf16\" -> \"fp32\"" -- "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 \
  --activation-dtype fp32 --resume b16/ck.step4.st
# --activation-dtype auto is recorded as the type it resolved to (fp32 on the CPU), and a
# checkpoint written before that (its config saying "auto", which was fp32 then) resumes as fp32
# and is refused as bf16.
mkdir auto16
run k.log "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 --checkpoint-every 2steps \
  --keep-checkpoints 3 --checkpoint-path auto16/ck.st || fail "the auto run failed: $(tail -2 k.log)"
[[ $(meta_of config auto16/ck.step4.st) == *'"activation_dtype":"fp32"'* ]] ||
  fail "--activation-dtype auto is not recorded as fp32: $(meta_of config auto16/ck.step4.st)"
python3 - auto16/ck.step4.st auto16/old.st <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
config = json.loads(head["__metadata__"]["config"])
config["activation_dtype"] = "auto"
head["__metadata__"]["config"] = json.dumps(config, separators=(",", ":"))
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
expect 0 "resumed from auto16/old.st" -- "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 \
  --resume auto16/old.st
expect 2 "--activation-dtype \"fp32\" -> \"bf16\"" -- "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 \
  --activation-dtype bf16 --resume auto16/old.st
# Under --precision bf16 on a CPU with bf16 instructions auto is bf16 (recorded so), and a resume
# with auto keeps the type the checkpoint was trained in: a run trained on fp32 activations (as
# auto gave before) resumes on them and ends bit for bit where it would have.
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  p16=(--precision bf16 --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64)
  mkdir p16
  run l.log "$bin" "${p16[@]}" --checkpoint-every 2steps --keep-checkpoints 3 --checkpoint-path p16/ck.st \
    --save p16auto.st || fail "the bf16 auto run failed: $(tail -2 l.log)"
  [[ $(meta_of config p16/ck.step4.st) == *'"activation_dtype":"bf16"'* ]] ||
    fail "--precision bf16 --activation-dtype auto is not recorded as bf16: $(meta_of config p16/ck.step4.st)"
  run o.log "$bin" "${p16[@]}" --resume p16/ck.step4.st --save p16autoresumed.st \
    || fail "the bf16 auto resume failed: $(tail -2 o.log)"
  same_tensors p16auto.st p16autoresumed.st || fail "the resumed --precision bf16 run does not end where the uninterrupted one ends"
  run m.log "$bin" "${p16[@]}" --activation-dtype fp32 --checkpoint-every 2steps --keep-checkpoints 3 \
    --checkpoint-path p16/f.st --save p16full.st || fail "the bf16 fp32-activation run failed: $(tail -2 m.log)"
  run n.log "$bin" "${p16[@]}" --resume p16/f.step4.st --save p16resumed.st \
    || fail "resuming an fp32-activation checkpoint with auto failed: $(tail -2 n.log)"
  grep -q "the checkpoint was trained with fp32 activations, and the resumed run keeps them" n.log \
    || fail "the resume did not say it keeps fp32 activations: $(grep -i activ n.log)"
  same_tensors p16full.st p16resumed.st || fail "the auto resume did not continue on fp32 activations"
else
  echo "(no AVX512-BF16 or AMX-BF16 here: the --precision bf16 resume checks skipped)"
fi

echo "== the recipe options (issue 32): AdamW's moments and step count, Nesterov SGD; resumed bit for bit"
# Mid-epoch (step 4 of 3-step epochs: epoch 2, step 1), 2 ranks: the optimizer's whole state must
# be in the file, and a resumed run end where the uninterrupted one ends.
recipes=("--optimizer adamw --betas 0.8,0.99 --eps 1e-6 --label-smoothing 0.1 --no-decay-bn-bias"
         "--nesterov --label-smoothing 0.2 --no-decay-bn-bias --weight-decay 0.01")
for i in 0 1; do
  read -r -a extra <<< "${recipes[$i]}"
  rc=(--epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 "${extra[@]}")
  mkdir "rc$i"
  run "r$i.log" "${mpi[@]}" "$bin" "${rc[@]}" --checkpoint-every 2steps --keep-checkpoints 3 \
    --checkpoint-path "rc$i/ck.st" --save "rc$i/full.st" || fail "${recipes[$i]}: the run failed: $(tail -2 "r$i.log")"
  run "s$i.log" "${mpi[@]}" "$bin" "${rc[@]}" --resume "rc$i/ck.step4.st" --save "rc$i/resumed.st" \
    || fail "${recipes[$i]}: the resume failed: $(tail -2 "s$i.log")"
  same_tensors "rc$i/full.st" "rc$i/resumed.st" || fail "${recipes[$i]}: the resumed run does not end where the uninterrupted one ends"
done
[[ $(meta_of optimizer rc0/ck.step4.st) == adamw && $(meta_of optimizer rc1/ck.step4.st) == sgd ]] ||
  fail "the checkpoints do not name their optimizer: '$(meta_of optimizer rc0/ck.step4.st)', '$(meta_of optimizer rc1/ck.step4.st)'"
python3 - rc0/ck.step4.st <<'PY' || fail "the AdamW checkpoint lacks its state"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; head = json.loads(f.read(n))
want = {"optimizer.exp_avg": "F32", "optimizer.exp_avg_sq": "F32", "optimizer.step": "I64"}
got = {k: v["dtype"] for k, v in head.items() if k.startswith("optimizer.")}
assert got == want, got
step = head["optimizer.step"]["data_offsets"]
f.seek(8 + n + step[0]); assert struct.unpack("<q", f.read(8))[0] == 4, "step count"
PY
# Another optimizer cannot take the state: refused even with --allow-config-change.
expect 2 "rc0/ck.step4.st: holds the state of --optimizer adamw, this run's is sgd: the optimizer cannot change on resume" \
  -- "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 --resume rc0/ck.step4.st --allow-config-change
expect 2 "holds the state of --optimizer sgd, this run's is adamw" \
  -- "$bin" --epochs 2 --max-steps 3 --eval-every 0 --batch-size 64 --optimizer adamw --resume rc1/ck.step4.st \
  --allow-config-change

echo "== a corrupt newest checkpoint falls back to the one before"
mkdir bad && cp run/ck.step12.st bad/ck.step12.st
python3 - run/ck.step14.st bad/ck.step14.st <<'PY'
import sys
raw = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(raw[:len(raw) // 2])  # a writer killed mid-copy: the header is intact
PY
run c.log "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path bad/ck.st --resume auto \
  || fail "the fallback resume failed: $(tail -2 c.log)"
grep -q "bad/ck.step14.st cannot be used" c.log || fail "no warning about the corrupt newest file"
grep -q "resumed from bad/ck.step12.st" c.log || fail "did not fall back to step 12: $(grep -i resum c.log)"

echo "== nothing to resume: a fresh start that says so; a killed writer's leftovers removed"
# (pids above 2^22, the largest pid_max Linux allows: no writer of these can be alive)
mkdir fresh && touch fresh/ck.st.tmp.4194309 fresh/ck.step4.st.tmp.4194308 fresh/other.tmp.4194307
run d.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path fresh/ck.st --resume auto \
  || fail "the fresh auto run failed: $(tail -2 d.log)"
grep -q "no checkpoint at or beside fresh/ck.st: starting fresh" d.log || fail "no fresh-start message"
[[ ! -e fresh/ck.st.tmp.4194309 && ! -e fresh/ck.step4.st.tmp.4194308 ]] || fail "leftover temporary files were not removed"
# Each logged once, naming the output (the pre-flight's pass alone: a second pass over the
# directory, the CheckpointManager's, logged the step-named one without the flag).
for f in fresh/ck.st.tmp.4194309 fresh/ck.step4.st.tmp.4194308; do
  [[ $(grep -cxF "removed $f, left by a killed writer of --checkpoint-path" d.log) -eq 1 ]] ||
    fail "the removal of $f is not logged once naming --checkpoint-path: $(grep removed d.log)"
done
[[ $(grep -c "removed " d.log) -eq 2 ]] || fail "want 2 removals logged: $(grep removed d.log)"
[[ -e fresh/other.tmp.4194307 ]] || fail "a file that is not ours was removed"
[[ -e fresh/ck.st ]] || fail "no checkpoint written"

echo "== minutes, and bad values"
run e.log "$bin" --epochs 1 --max-steps 6 --eval-every 0 --checkpoint-every 0.0001min --checkpoint-path m.st \
  || fail "the minutes run failed"
[[ $(grep -c "checkpoint written" e.log) -ge 5 ]] || fail "want a checkpoint at (nearly) every step boundary: $(grep -c 'checkpoint written' e.log)"
for v in 2parsecs -1 1.5steps x; do
  run f.log "$bin" --checkpoint-every "$v"
  [[ $? -eq 2 ]] && grep -q -- "--checkpoint-every" f.log || fail "--checkpoint-every $v: $(cat f.log)"
done

echo "== file text in messages: control bytes escaped, long text cut, long lists summarised"
# set_meta SRC DST KEY VALUE: a copy of checkpoint SRC whose metadata KEY is VALUE (Python escapes
# allowed, e.g. \x1b); the tensors stay as they are.
set_meta() {
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, key, value = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
head["__metadata__"][key] = value.encode().decode("unicode_escape")
h = json.dumps(head).encode()
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
}
# longest FILE: the length of its longest line.
longest() { awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }' "$1"; }
mkdir txt
run t.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path txt/ck.st \
  || fail "the run for the text checks failed: $(tail -2 t.log)"
set_meta txt/ck.st txt/ck.st 'training_id' 'evil\n[rank 0@host] error: forged line\x1b[31m'
run t.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path txt/ck.st
rc=$?
if [[ $rc -ne 2 ]] || grep -q $'\x1b' t.log || grep -q '^\[rank 0@host\] error: forged' t.log ||
   ! grep -qF 'another training (id evil\n[rank 0@host] error: forged line\x1b[31m,' t.log; then
  fail "an id with a newline and ESC: exit $rc, printed raw or not named escaped: $(grep -a -A1 'another training' t.log | cat -v)"
fi
set_meta txt/ck.st txt/ck.st 'training_id' "$(head -c 100000 /dev/zero | tr '\0' 'i')"
run t.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path txt/ck.st
rc=$?
[[ $rc -eq 2 && $(longest t.log) -lt 2000 ]] && grep -qF "(100000 bytes)" t.log ||
  fail "a 100 KB id: exit $rc, longest line $(longest t.log) bytes (want exit 2, the id cut)"
# A directory of 3,000 other trainings' files (headers only) and 3,000 files that are no
# checkpoint: a few lines, each short, and "and N more".
mkdir many
python3 - many <<'PY'
import json, struct, sys
for i in range(3000):
    h = json.dumps({"__metadata__": {"training_id": "id%04d" % i, "step": str(i + 1), "optimizer_steps": str(i + 1)}}).encode()
    open(f"{sys.argv[1]}/ck.step{i + 1}.st", "wb").write(struct.pack("<Q", len(h)) + h)
    open(f"{sys.argv[1]}/ck.step{i + 5001}.st", "wb").write(b"not a checkpoint")
PY
run t.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path many/ck.st --resume auto
rc=$?
lines=$(grep -c -- "--resume auto" t.log)
if [[ $rc -ne 2 || $lines -gt 6 || $(longest t.log) -gt 2000 ]] || ! grep -qF "and 2,996 more)" t.log ||
   ! grep -qF "no checkpoint, their header unreadable: many/ck.step8000.st, many/ck.step7999.st, many/ck.step7998.st and 2,997 more" t.log; then
  fail "--resume auto beside 6,000 foreign files: exit $rc, $lines lines, longest $(longest t.log) bytes: $(cut -c1-200 t.log | tail -8)"
fi

echo "== a fresh run warns before replacing a checkpoint that records no training id"
set_meta txt/ck.st txt/ck.st 'training_id' ''
run t.log "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path txt/ck.st \
  || fail "the run over an id-less checkpoint failed: $(tail -2 t.log)"
grep -qF "replacing txt/ck.st, a checkpoint at step 2 that records no training id" t.log ||
  fail "no warning before replacing an id-less checkpoint: $(grep -i 'warn\|replac' t.log)"
# The same file resumed, named without a directory: the survey names it ./idl.st, and compared as
# text with the idl.st resumed, it was warned about as a file this run replaces without continuing.
set_meta txt/ck.st idl.st 'training_id' ''
run t.log "$bin" --epochs 2 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path idl.st --resume idl.st \
  --allow-config-change ||
  fail "the resume of an id-less checkpoint failed: $(tail -2 t.log)"
grep -q "resumed from idl.st" t.log || fail "did not resume idl.st: $(grep -i 'resum' t.log)"
! grep -qF "replacing" t.log || fail "the id-less checkpoint resumed was warned about as replaced: $(grep -F replacing t.log)"

echo "== a shared directory: the operator's own files, other trainings on other data, junk"
# Retention removes step-named checkpoints only: "ck.step4.mybackup.st" and "ck.stepBEST.st", the
# operator's copies of a checkpoint of this very training, were deleted.
mkdir shared && cp run/ck.step14.st shared/ck.step4.mybackup.st && cp run/ck.step14.st shared/ck.stepBEST.st &&
  cp run/ck.step14.st shared/ck.step0014.st  # dptrain writes no leading zero
run s.log "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path shared/ck.st   || fail "the run beside the backups failed: $(tail -2 s.log)"
[[ -e shared/ck.step4.mybackup.st && -e shared/ck.stepBEST.st && -e shared/ck.step0014.st ]] || fail "retention removed the operator's backups: $(ls shared | tr '\n' ' ')"
# Two trainings with the same flags on other data: --resume auto takes the one on this run's data
# (by the digests it records), even when the other's file is newer; it took the newest before and
# refused it.
mkdir other
run o.log "$bin" "${base[@]}" --data synthetic:28x28x1:1024:10 --checkpoint-every 2steps --keep-checkpoints 2 \
  --checkpoint-path other/ck.st || fail "the other-data run failed: $(tail -2 o.log)"
mkdir mixed && cp run/ck.step12.st mixed/ck.step12.st && cp other/ck.step14.st mixed/ck.step99.st
run m.log "${mpi[@]}" "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path mixed/ck.st \
  --resume auto --save mixed.st || fail "--resume auto beside another data set's newer file (recorded step 14) failed: $(tail -2 m.log)"
grep -q "resumed from mixed/ck.step12.st" m.log || fail "did not resume this data's training: $(grep -i 'resum\|passed' m.log)"
same_tensors full.st mixed.st || fail "the run resumed beside another data set's file does not end where the uninterrupted run ends"
# Junk at checkpoint names (an empty file, text): no checkpoint, passed over with one warning that
# lists them in the checkpoints' order (by the step of each name, newest first; the text order put
# step10 after step4); the first run starts fresh instead of refusing for ever, and the empty file
# at the name of its step 4 is replaced with a warning that names it (it was replaced in silence),
# the others kept.
mkdir junk && : > junk/ck.step4.st && echo junk > junk/ck.step6.st && echo junk > junk/ck.step10.st
run j.log "$bin" --epochs 1 --max-steps 4 --eval-every 0 --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path junk/ck.st \
  --resume auto || fail "--resume auto beside junk refused to start: $(tail -2 j.log)"
grep -qF "passed over 3 file(s) that are no checkpoint, their header unreadable: junk/ck.step10.st, junk/ck.step6.st, junk/ck.step4.st" j.log ||
  fail "no warning about the junk, in step order: $(grep -i 'auto' j.log)"
grep -q "starting fresh" j.log || fail "no fresh start beside junk"
[[ $(grep -c "replacing junk/ck.step4.st, an empty file, no checkpoint" j.log) -eq 1 ]] ||
  fail "the empty file at the name of step 4 was not named once before it was replaced: $(grep -i 'replac' j.log)"
grep -q "replacing junk/ck.step\(6\|10\)" j.log && fail "named a file it does not replace: $(grep -i 'replac' j.log)"
[[ $(step_of junk/ck.step4.st) == 4 && $(cat junk/ck.step6.st junk/ck.step10.st) == $'junk\njunk' ]] ||
  fail "want ck.step4.st the checkpoint of step 4 and the other junk kept: $(ls -l junk)"
# A checkpoint cut short inside its header is damaged, not junk: refused, never replaced by a
# fresh run.
mkdir cut && head -c 200 run/ck.step14.st > cut/ck.st
expect 2 "no checkpoint beside cut/ck.st could be read (cut/ck.st)" -- \
  "$bin" --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1 --checkpoint-path cut/ck.st --resume auto
[[ $(stat -c %s cut/ck.st) -eq 200 ]] || fail "the damaged checkpoint was replaced"
# A name this run will write that cannot be replaced: refused before the first step, not at it.
mkdir blocked && mkfifo blocked/ck.step2.st && mkdir blocked/ck.step4.st
expect 2 "blocked/ck.step2.st is a FIFO, where this run would write its checkpoint of step 2" -- \
  "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path blocked/ck.st
grep -q "epoch 1/" "$tmp/out.txt" && fail "the run trained before refusing the FIFO"
rm blocked/ck.step2.st
expect 2 "blocked/ck.step4.st is a directory" -- \
  "$bin" "${base[@]}" --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path blocked/ck.st

echo "== an epoch resumed part-way: its record is the whole epoch's, as the uninterrupted run's"
# Epoch 1 resumed at its step 2, then that resumed run's own checkpoint at step 4 resumed again
# (the sums carried twice); epoch 2 after them is a whole epoch either way. The loss may differ in
# its last bits (the ranks' sums are added in another order); counts and gradient norms are exact.
part=(--epochs 2 --max-steps 6 --eval-every 0 --batch-size 64 --checkpoint-every 2steps --keep-checkpoints 9)
mkdir part part2 part3
run p.log "${mpi[@]}" "$bin" "${part[@]}" --checkpoint-path part/ck.st --metrics whole.jsonl \
  || fail "the uninterrupted run failed: $(tail -2 p.log)"
run p2.log "${mpi[@]}" "$bin" "${part[@]}" --checkpoint-path part2/ck.st --resume part/ck.step2.st \
  --metrics r1.jsonl || fail "the run resumed at step 2 failed: $(tail -2 p2.log)"
run p3.log "${mpi[@]}" "$bin" "${part[@]}" --checkpoint-path part3/ck.st --resume part2/ck.step4.st \
  --metrics r2.jsonl || fail "the run resumed at step 4 (a resumed run's checkpoint) failed: $(tail -2 p3.log)"
python3 - whole.jsonl r1.jsonl r2.jsonl <<'PY' || fail "a resumed epoch's record is not the whole epoch's"
import json, math, sys
def epochs(path):
    return {r["epoch"]: r for r in map(json.loads, open(path)) if r["type"] == "epoch"}
whole = epochs(sys.argv[1])
assert sorted(whole) == [1, 2] and whole[1]["steps"] == 6 and whole[1]["train_count"] == 384, whole[1]
for path in sys.argv[2:]:
    for e, rec in epochs(path).items():
        w = whole[e]
        for key in ("steps", "train_count", "train_acc", "grad_norm", "grad_norm_max", "nonfinite_steps"):
            assert rec[key] == w[key], f"{path} epoch {e}: {key} {rec[key]} against {w[key]}"
        assert math.isclose(rec["train_loss"], w["train_loss"], rel_tol=1e-12), (path, e, rec["train_loss"], w["train_loss"])
print("ok: the records of epochs resumed at step 2 and at step 4 (resumed twice) are the whole epoch's")
PY
# A checkpoint written before the sums were recorded resumes as it did: the record covers the
# steps after it. Sums that contradict the checkpoint's position are refused naming the field.
edit_meta() {  # edit_meta FILE PYTHON-EXPRESSION-ON-m (the metadata dict)
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; head = json.loads(raw[8:8 + n])
m = head["__metadata__"]; exec(sys.argv[2])
h = json.dumps(head).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
}
cp part/ck.step2.st old.st && edit_meta old.st 'del m["epoch_so_far"]'
run p4.log "${mpi[@]}" "$bin" "${part[@]}" --checkpoint-every 0 --resume old.st --metrics old.jsonl \
  || fail "a checkpoint without epoch_so_far did not resume: $(tail -2 p4.log)"
python3 -c 'import json,sys; r=[r for r in map(json.loads, open("old.jsonl")) if r["type"] == "epoch"][0]; sys.exit(r["steps"] != 4 or r["train_count"] != 256)' \
  || fail "without epoch_so_far the record should cover the 4 steps after the checkpoint: $(tail -1 old.jsonl)"
cp part/ck.step2.st bad.st && edit_meta bad.st 'm["epoch_so_far"] = m["epoch_so_far"].replace("\"steps\":2", "\"steps\":3")'
expect 2 "bad.st: metadata 'epoch_so_far' counts 3 steps, 'epoch_step' is 2" -- \
  "${mpi[@]}" "$bin" "${part[@]}" --resume bad.st
cp part/ck.step2.st bad.st && edit_meta bad.st 'm["epoch_so_far"] = json.dumps(dict(json.loads(m["epoch_so_far"]), loss=-1))'
expect 2 "bad.st: metadata 'epoch_so_far' is not the running sums of an epoch" -- \
  "${mpi[@]}" "$bin" "${part[@]}" --resume bad.st

echo "== an epoch resumed part-way: its seconds, images per second and communication times carry on"
# The checkpoint's sums say its first 2 steps took 1000 s (300 s of communication, 200 s of it
# exposed): the resumed epoch's record adds this run's own time to them, and its images per second
# are the epoch's 384 images over that total; the next epoch starts from nothing.
cp part/ck.step2.st slow.st &&
  edit_meta slow.st 'm["epoch_so_far"] = json.dumps(dict(json.loads(m["epoch_so_far"]), seconds=1000, comm_seconds=300, exposed_seconds=200))'
run ps.log "${mpi[@]}" "$bin" "${part[@]}" --checkpoint-every 0 --resume slow.st --metrics slow.jsonl \
  || fail "the run resumed from slow.st failed: $(tail -2 ps.log)"
python3 - slow.jsonl <<'PY' || fail "the resumed epoch's times do not carry the checkpoint's"
import json, math, sys
e = {r["epoch"]: r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "epoch"}
one, two = e[1], e[2]
assert 1000 <= one["epoch_seconds"] < 1000 + 120, one["epoch_seconds"]
assert math.isclose(one["images_per_second"], 384 / one["epoch_seconds"], rel_tol=1e-9), one
assert 300 <= one["comm_seconds"] < 300 + 120 and 200 <= one["exposed_comm_seconds"] < 200 + 120, one
assert two["epoch_seconds"] < 120 and two["comm_seconds"] < 120, two
assert math.isclose(two["images_per_second"], 384 / two["epoch_seconds"], rel_tol=1e-9), two
print("ok: the resumed epoch's record carries the checkpoint's 1000 s: %.1f s" % one["epoch_seconds"])
PY

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
