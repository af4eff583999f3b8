#!/usr/bin/env bash
# Stops and restarts as an operator meets them, through launch/mpirun.sh and plain mpirun:
# SIGTERM / SIGINT to the launcher reach every rank, which finish their step and write the
# checkpoint, and the launcher exits 143 / 130 with no rank left behind; SIGUSR1 to plain mpirun is
# forwarded and does the same (exit 138); the resumed run ends bit for bit where an uninterrupted
# one ends, with every step's metrics record once. --max-restarts restarts a job killed after a
# checkpoint (again bit for bit), and not one that failed before any checkpoint or on bad input.
# A host that accepts the TCP connection and never answers ssh fails the launch in seconds, named.
# Usage: test_signals.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
launcher=$(cd "$(dirname "$0")/../../launch" && pwd)/mpirun.sh
cd "$tmp" || exit 1
job=""
trap '[[ -n $job ]] && kill -9 $job 2>/dev/null; pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
# 2 epochs of 150 steps; a metrics record per step. Outputs under $tmp, so that a rank left
# behind is found by its command line.
common=(--model lenet --batch-size 64 --eval-batch-size 2000 --seed 5 --epochs 2 --max-steps 150
        --checkpoint-every 1 --metrics-every 1)
launch() { timeout -k 5 240 bash "$launcher" "$@"; }

# Waits (up to 60 s) until file $1 has at least $2 lines: training is under way.
wait_lines() {
  for _ in $(seq 600); do
    [[ -f $1 && $(wc -l <"$1") -ge $2 ]] && return 0
    sleep 0.1
  done
  fail "$1 did not reach $2 lines"
  return 1
}
# The pid of world rank $1 of the job whose command line holds $2.
rank_pid() {
  local p
  for p in $(pgrep -f -- "$2"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
# Every process of a run (its outputs are in directory $1) has ended.
none_left() {
  local left
  left=$(pgrep -af -- "$tmp/$1/" | grep -v pgrep)
  [[ -z $left ]] || fail "processes of $1 outlived the launcher: $left"
}
# The step records of two metrics files: the same steps, each once, with the same loss, accuracy,
# learning rate and gradient norm (timings aside).
same_steps() { python3 "$lib_dir/same_steps.py" "$1" "$2" || fail "the step records of $2 differ from $1"; }

echo "== the uninterrupted reference"
mkdir ref
launch -np 2 "$bin" "${common[@]}" --checkpoint-path "$tmp/ref/ck.st" --metrics "$tmp/ref/m.jsonl" \
  --save "$tmp/ref/final.st" >ref.log 2>&1 || fail "the reference run failed: $(tail -3 ref.log)"
[[ $(grep -c '"type":"step"' ref/m.jsonl) -eq 300 ]] || fail "the reference has $(grep -c '"type":"step"' ref/m.jsonl) step records, want 300"

# Starts a launcher run with outputs in directory $1 (launcher flags in $LAUNCH_FLAGS) in the
# background ($job), then waits for $2 metrics lines.
start_run() {
  mkdir -p "$1"
  # Job control on: a background job of a script otherwise starts with SIGINT ignored, which the
  # launcher could not trap (as under a terminal, it must be able to).
  set -m
  # shellcheck disable=SC2086
  bash "$launcher" ${LAUNCH_FLAGS:-} -np 2 "$bin" "${common[@]}" --checkpoint-path "$tmp/$1/ck.st" \
    --metrics "$tmp/$1/m.jsonl" "${@:3}" >"$1.log" 2>&1 &
  job=$!
  set +m
  wait_lines "$1/m.jsonl" "$2"
}
finish_run() {  # waits for $job (at most 120 s); sets rc
  rc=124
  for _ in $(seq 1200); do
    kill -0 "$job" 2>/dev/null || { wait "$job"; rc=$?; break; }
    sleep 0.1
  done
  job=""
}

for sig in TERM INT; do
  [[ $sig == INT ]] && want=130 || want=143
  echo "== SIG$sig to launch/mpirun.sh: checkpoint, exit $want, no rank left; the resumed run ends bit for bit"
  start_run "$sig" 20
  kill -"$sig" "$job"
  finish_run
  [[ $rc -eq $want ]] || fail "SIG$sig: the launcher exited $rc, want $want: $(tail -3 "$sig.log")"
  grep -q "SIGUSR1: checkpoint of epoch 1 step" "$sig.log" || fail "SIG$sig: no stop checkpoint: $(tail -5 "$sig.log")"
  grep -q "launch/mpirun.sh: stopped by signal" "$sig.log" || fail "SIG$sig: the launcher did not say why it stopped"
  none_left "$sig"
  launch -np 2 "$bin" "${common[@]}" --checkpoint-path "$tmp/$sig/ck.st" --metrics "$tmp/$sig/m.jsonl" --resume auto \
    --save "$tmp/$sig/final.st" >"$sig.resume.log" 2>&1 || fail "the resume after SIG$sig failed: $(tail -3 "$sig.resume.log")"
  same_tensors ref/final.st "$sig/final.st" || fail "SIG$sig then --resume auto does not end where the uninterrupted run ends"
  same_steps ref/m.jsonl "$sig/m.jsonl"
done

echo "== SIGUSR1 to plain mpirun is forwarded to every rank: checkpoint, exit 138"
mkdir usr1
"${mpi[@]}" -np 2 "$bin" "${common[@]}" --checkpoint-path "$tmp/usr1/ck.st" --metrics "$tmp/usr1/m.jsonl" >usr1.log 2>&1 &
job=$!
wait_lines usr1/m.jsonl 20
kill -USR1 "$job"
finish_run
[[ $rc -eq 138 ]] || fail "SIGUSR1 to mpirun: exit $rc, want 138: $(tail -3 usr1.log)"
grep -q "SIGUSR1: checkpoint of epoch 1 step" usr1.log || fail "SIGUSR1 to mpirun: no stop checkpoint"
[[ -s usr1/ck.st ]] || fail "SIGUSR1 to mpirun: no checkpoint file"
none_left usr1

echo "== --max-restarts: a rank killed after a checkpoint; the job restarts and ends bit for bit"
LAUNCH_FLAGS="--max-restarts 2" start_run restart 5 --checkpoint-every 40steps --save "$tmp/restart/final.st"
for _ in $(seq 600); do [[ -f restart/ck.st ]] && break; sleep 0.1; done
sleep 0.5
p=$(rank_pid 1 "$tmp/restart/")
[[ -n $p ]] || fail "no rank 1 of the restart run"
kill -9 "$p"
finish_run
[[ $rc -eq 0 ]] || fail "--max-restarts: the launcher exited $rc, want 0: $(tail -5 restart.log)"
grep -q "restart 1 of 2 with --resume auto" restart.log || fail "--max-restarts: no restart announced: $(grep mpirun.sh restart.log)"
grep -q "resumed from $tmp/restart/ck.st" restart.log || fail "--max-restarts: the restart did not resume: $(grep -i resum restart.log)"
same_tensors ref/final.st restart/final.st || fail "the restarted job does not end where the uninterrupted run ends"
same_steps ref/m.jsonl restart/m.jsonl
none_left restart

echo "== --max-restarts: no restart without a new checkpoint, nor after bad input"
LAUNCH_FLAGS="--max-restarts 2" start_run early 3
p=$(rank_pid 0 "$tmp/early/")
[[ -n $p ]] && kill -9 "$p"
finish_run
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "a job killed before its first checkpoint: launcher exit $rc"
grep -q "without writing a checkpoint since it started: not restarting" early.log || fail "no 'not restarting': $(tail -3 early.log)"
none_left early
expect 2 "--lr: 'nan' is not a number" -- bash "$launcher" --max-restarts 3 -np 2 "$bin" --lr nan --checkpoint-every 1
grep -q "restart" "$tmp/out.txt" && fail "a refused flag was restarted"
expect 2 "--max-restarts: 'x' is not a whole number" -- bash "$launcher" --max-restarts x -np 2 "$bin"
expect 2 "--ssh-timeout: '0' is not a whole number" -- bash "$launcher" --ssh-timeout 0 -np 2 "$bin"

echo "== evaluate and predict stop on a signal too: exit 128 + signal, nothing written"
# They ran to the end before, ignoring INT, TERM, HUP and USR1 (blocked for every command, watched
# only by training), and the launcher then reported 143 for a run that had written everything.
syn=synthetic:28x28x1:40000:10  # 4,000 test images: ResNet-18 scores them for several seconds
mkdir -p evaluate
"$bin" --model resnet18 --data $syn --epochs 1 --max-steps 1 --batch-size 8 --eval-every 0 --save "$tmp/evaluate/r18.st" > r18.log 2>&1 ||
  fail "training the model to score failed: $(tail -2 r18.log)"
"$bin" predict --load "$tmp/evaluate/r18.st" --data $syn --eval-batch-size 50 --output p.csv > p.log 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "dptrain predict:" p.log && break; sleep 0.1; done
kill -INT $job
wait $job
rc=$?
job=""
[[ $rc -eq 130 ]] || fail "predict after SIGINT: exit $rc, want 130: $(tail -2 p.log)"
grep -q "stopped by SIGINT before anything was written" p.log || fail "predict: no stop message"
[[ ! -e p.csv ]] || fail "predict wrote --output after SIGINT"
set -m  # as in start_run: the launcher must be able to trap the signal
bash "$launcher" -np 2 "$bin" evaluate --load "$tmp/evaluate/r18.st" --data $syn --eval-batch-size 50 --metrics e.json > e.log 2>&1 &
job=$!
set +m
for _ in $(seq 300); do grep -q "dptrain evaluate:" e.log && break; sleep 0.1; done
kill -TERM $job
finish_run
[[ $rc -eq 143 ]] || fail "evaluate after SIGTERM to the launcher: exit $rc, want 143: $(tail -2 e.log)"
grep -q "stopped by SIGUSR1 before anything was written" e.log || fail "evaluate: no stop message: $(tail -3 e.log)"
[[ ! -e e.json ]] || fail "evaluate wrote --metrics after SIGTERM"
none_left evaluate
echo "predict: exit 130 after SIGINT; evaluate under the launcher: exit 143 after SIGTERM"

echo "== a host that never answers ssh: the launch fails within seconds, naming it"
# In a private network namespace, 127.0.0.2 (which mpirun reaches over ssh: it is not an address of
# an interface) accepts the connection and stays silent, as a hung host does.
if ! command -v ssh >/dev/null || ! unshare -n true 2>/dev/null; then
  fail "needs ssh (openssh-client) and unshare -n (root): $(command -v ssh || echo 'no ssh')"
else
  t0=$SECONDS
  unshare -n bash -c '
    ip link set lo up || exit 9
    python3 -c "import socket, time
s = socket.socket(); s.bind((\"127.0.0.2\", 22)); s.listen(); time.sleep(60)" &
    listener=$!
    sleep 0.5
    timeout -k 2 60 bash "$0" --ssh-timeout 2 --host 127.0.0.2:2 -np 2 "$1" --epochs 1
    rc=$?; kill $listener; exit $rc' "$launcher" "$bin" >ssh.log 2>&1
  rc=$? took=$((SECONDS - t0))
  [[ $rc -eq 2 ]] || fail "unreachable host: exit $rc, want 2: $(tail -3 ssh.log)"
  grep -q "host '127.0.0.2' cannot be reached" ssh.log || fail "unreachable host not named: $(tail -3 ssh.log)"
  ((took <= 20)) || fail "unreachable host: the launch took ${took}s to fail (--ssh-timeout 2)"
  echo "unreachable host: exit $rc after ${took}s: $(grep -o "host '127.0.0.2'.*" ssh.log | head -1 | cut -c1-160)"
fi

echo "== a stop during the epoch's evaluation: the epoch's checkpoint is the stop's, written once"
# The signal lands in epoch 1's evaluation (300 ResNet-18 images, seconds) after its last step; the
# epoch's checkpoint at global step 1 follows, and the stop at the next boundary (the same step)
# wrote it a second time.
mkdir once
"$bin" --model resnet18 --data synthetic:32x32x3:3000:10 --epochs 2 --max-steps 1 --batch-size 16 \
  --threads 1 --checkpoint-every 1 --checkpoint-path once/ck.st --metrics-every 1 --metrics once/m.jsonl \
  --progress off >once.log 2>&1 &
job=$!
wait_lines once/m.jsonl 1 && kill -TERM $job
wait $job
rc=$? job=""
[[ $rc -eq 143 ]] || fail "stopped during the evaluation: exit $rc, want 143: $(tail -3 once.log)"
[[ $(grep -c "checkpoint written" once.log) -eq 1 ]] ||
  fail "want one checkpoint of global step 1, the log says: $(grep "checkpoint" once.log | tr '\n' ';')"
grep -q "SIGTERM: checkpoint of epoch 2 step 0 written to once/ck.st" once.log ||
  fail "the stop did not name its checkpoint: $(tail -3 once.log)"
[[ $(meta_of step once/ck.st) == 1 ]] || fail "once/ck.st records step $(meta_of step once/ck.st), want 1"

echo "== a stop during a long evaluation ends it at the next batch: no test metrics, the checkpoint, exit 143"
# 2,000 ResNet-18 test images in batches of 50 take about 12 s on one thread here. The stop waited
# for the whole evaluation, past a batch system's warning time, and the epoch's checkpoint comes
# after it. Sent once the evaluation has begun (its debug line): the epoch's record has no test
# metrics, and the run stops at the next boundary with its checkpoint.
mkdir longeval
"$bin" --model resnet18 --data synthetic:28x28x1:20000:10 --epochs 2 --max-steps 1 --batch-size 16 \
  --eval-batch-size 50 --threads 1 --checkpoint-every 1 --checkpoint-path longeval/ck.st \
  --metrics longeval/m.jsonl --progress off --log-level debug >longeval.log 2>&1 &
job=$!
for _ in $(seq 600); do
  grep -q "evaluating test images \[0, 2000) of epoch 1" longeval.log && break
  sleep 0.1
done
sleep 1
kill -TERM $job
wait $job
rc=$? job=""
[[ $rc -eq 143 ]] || fail "stopped in a long evaluation: exit $rc, want 143: $(tail -3 longeval.log)"
grep -q "a stop signal ended the evaluation of epoch 1 early on 1 rank(s): no test metrics for it; the run stops at the next step boundary, after its checkpoint" longeval.log ||
  fail "the evaluation was not cut short, or not said: $(grep -E 'warning|epoch 1/' longeval.log | tail -3)"
python3 -c '
import json, sys
ep = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "epoch"]
sys.exit(0 if ep and ep[0]["epoch"] == 1 and ep[0]["test_acc"] is None else 1)' longeval/m.jsonl ||
  fail "epoch 1's record should have no test accuracy: $(grep epoch longeval/m.jsonl | head -1 | cut -c1-200)"
[[ $(meta_of step longeval/ck.st) == 1 ]] || fail "longeval/ck.st records step $(meta_of step longeval/ck.st), want 1"
# The short evaluation above: cut or not by the signal's timing, its record says which.
if grep -q "ended the evaluation of epoch 1 early" once.log; then want=None; else want=number; fi
python3 -c '
import json, sys
ep = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "epoch"]
acc = ep[0]["test_acc"] if ep else "missing"
sys.exit(0 if (acc is None) == (sys.argv[2] == "None") else 1)' once/m.jsonl "$want" ||
  fail "once: the epoch record's test accuracy does not match the log (want $want)"

echo "failures: $fails"
[[ $fails -eq 0 ]]
