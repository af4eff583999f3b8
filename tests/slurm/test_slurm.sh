#!/usr/bin/env bash
# Slurm launch test: starts a private one-node Slurm cluster (munged, slurmctld, slurmd, all under
# a temp dir on free ports, config generated from `slurmd -C`), submits
# launch/slurm/dptrain.sbatch (a copy at a path with a space, submitted by a relative path with
# --chdir) for a short 2-rank LeNet run, and checks that the job COMPLETED
# with exit code 0 and that its metrics line says world_size 2 and test_count 10000. Then a second
# job gets the time-limit warning (SIGUSR1) mid-run: it must checkpoint, requeue itself, resume and
# end bit for bit where an uninterrupted run ends; a third, with --checkpoint-every 0, must not be
# requeued (no checkpoint to resume from; its signal goes to the batch script alone, which passes it
# on); scancel checkpoints; a wrong DPTRAIN is exit 2 named;
# hostile arguments are one word each, printed quoted. The daemons
# are stopped by their PIDs and the temp dir removed on every exit. Exits 77 (meson's skip code)
# with the reason when the machine cannot host the cluster.
# Usage: tests/slurm/test_slurm.sh path/to/dptrain
# shellcheck disable=SC2317  # functions are called through traps and wait_for
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
script=$repo/launch/slurm/dptrain.sbatch
start_s=$SECONDS

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  exit 1
}
log() { printf '[%3ds] %s\n' $((SECONDS - start_s)) "$*"; }

[[ $# -ge 1 ]] || fail "usage: $0 path/to/dptrain"
bin=$(readlink -f "$1") || fail "cannot resolve '$1'"
[[ -x $bin ]] || fail "dptrain binary '$1' not found or not executable"
[[ -f $script ]] || fail "$script is missing"

# What the cluster needs; anything missing is a skip, not a failure.
[[ $(id -u) -eq 0 ]] || skip "needs root (slurmd must run as root to launch tasks; SlurmUser=root)"
for p in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  command -v "$p" >/dev/null 2>&1 ||
    skip "'$p' not found (install with: apt-get install -y slurm-wlm munge)"
done
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}
[[ -d $data ]] || skip "no Fashion-MNIST at $data (apt-get install dataset-fashion-mnist)"

tmp=$(mktemp -d /tmp/dpt-slurm.XXXXXX) || fail "mktemp failed"
chmod 755 "$tmp"
pids=()   # daemons to stop, in start order
jobid=""  # the submitted job, cancelled on an early exit

cleanup() {
  local rc=$?
  local i pid
  trap - INT TERM
  # A job still running (the test was interrupted or timed out) is cancelled while slurmctld is
  # up, so that its slurmstepd, srun and ranks end with it (they outlive slurmd otherwise).
  if [[ -n $jobid ]] && ! job_done; then
    scancel "$jobid" 2>/dev/null && wait_for 15 job_done
  fi
  # Stop in reverse order: slurmd, slurmctld, munged.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[i]}
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do  # up to 5 s, then SIGKILL
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # Last resort: any process still carrying this cluster's SLURM_CONF (slurmstepd, srun, dptrain
  # ranks; the path holds the unique temp dir) is one this test started.
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "SLURM_CONF=$tmp/slurm.conf" &&
      kill -9 "$pid" 2>/dev/null
  done
  if ((rc != 0 && rc != 77)) && [[ -d $tmp ]]; then
    echo "---- logs (test failed, rc $rc) ----"
    for f in "$tmp"/log/* "$tmp"/job-*.out; do
      [[ -f $f ]] || continue
      echo "==> $f <=="
      tail -n 30 "$f"
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits up to $1 seconds (polling every 0.2 s) for the command in $2... to succeed.
wait_for() {
  local limit=$1
  shift
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# Two free TCP ports (another session's Slurm may own the default 6817/6818).
free_ports() {
  local out
  out=$(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))' 2>/dev/null) && [[ $out =~ ^[0-9]+\ [0-9]+$ ]] && {
    echo "$out"
    return
  }
  # Fallback without python3: random ports in 20000-39999 that nothing answers on.
  local ports=() p
  while ((${#ports[@]} < 2)); do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || ports+=("$p")
  done
  echo "${ports[@]}"
}

mkdir -p "$tmp"/{munge,log,state,spool,run,tmpfs}
chmod 755 "$tmp/munge"  # munged refuses a socket dir that others cannot search
chmod 700 "$tmp/state" "$tmp/spool"

# ---- munged with its own key and socket ----
sock=$tmp/munge/munge.socket
dd if=/dev/urandom of="$tmp/run/munge.key" bs=1 count=1024 status=none || fail "cannot create munge key"
chmod 400 "$tmp/run/munge.key"
munged --foreground --socket="$sock" --key-file="$tmp/run/munge.key" \
  --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/run/munged.seed" </dev/null >>"$tmp/log/munged.log" 2>&1 &
pids+=($!)
wait_for 5 test -S "$sock" || fail "munged did not create its socket within 5 s"
kill -0 "${pids[0]}" 2>/dev/null || fail "munged exited"
if command -v munge >/dev/null && command -v unmunge >/dev/null; then
  munge -S "$sock" -n | unmunge -S "$sock" >/dev/null || fail "munge credential round trip failed"
fi
log "munged up (pid ${pids[0]})"

# ---- slurm.conf from slurmd -C ----
host=$(hostname -s)
node_line=$(slurmd -C | grep '^NodeName=') || fail "slurmd -C printed no NodeName line"
# Addresses given, not resolved: a minimal Debian's host name may have no /etc/hosts entry.
node_line=$(sed -E "s/^NodeName=[^ ]+/NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host/" <<<"$node_line")
read -r ctld_port d_port < <(free_ports)
[[ -n $ctld_port && -n $d_port ]] || fail "could not find free ports"
export SLURM_CONF=$tmp/slurm.conf
cat >"$SLURM_CONF" <<EOF
# Generated by tests/slurm/test_slurm.sh: a private one-node cluster.
ClusterName=dpttest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$tmp/log/jobcomp.txt
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
# TmpFS also holds the PMIx plugin's per-step dirs (default /tmp/spmix_appdir_<uid>_<job>.<step>,
# which another private cluster's job 1 would share).
TmpFS=$tmp/tmpfs
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$node_line State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=10 State=UP
EOF
log "slurm.conf: $node_line; ports $ctld_port/$d_port"
srun --mpi=list 2>&1 | grep -q pmix || skip "this Slurm has no PMIx MPI plugin (srun --mpi=list)"

# ---- slurmctld and slurmd in the foreground (-D) so that $! is the daemon ----
slurmctld -D -i -f "$SLURM_CONF" </dev/null >>"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
wait_for 15 scontrol ping || fail "slurmctld did not answer within 15 s"
slurmd -D -f "$SLURM_CONF" -N "$host" </dev/null >>"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
node_idle() { sinfo -h -n "$host" -o '%t' | grep -qx 'idle'; }
wait_for 20 node_idle || fail "node $host not idle within 20 s (sinfo: $(sinfo -h -o '%t %E' 2>&1))"
log "slurmctld (pid ${pids[1]}) and slurmd (pid ${pids[2]}) up; node $host idle"

# ---- the job ----
metrics=$tmp/m.jsonl
# A private copy of the binary: other builds of this tree may relink build/dptrain while the job
# runs (its RUNPATH is absolute, so the copy loads the same libraries).
cp "$bin" "$tmp/dptrain" || fail "cannot copy $bin"
export DPTRAIN=$tmp/dptrain
log "DPTRAIN=$DPTRAIN (a copy of $bin)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Submitted as `sbatch --chdir=DIR launch/slurm/dptrain.sbatch` from the root of a checkout whose
# path has a space (a copy of launch/): the script found its repository from the first word of
# scontrol's Command=, taken relative to the job's directory, and failed with exit 2
# ("checkpoint_record.sh not found beside this script"), naming Slurm's spool directory.
mkdir -p "$tmp/check out" "$tmp/j1"
cp -r "$repo/launch" "$tmp/check out/" || fail "cannot copy launch/"
jobid=$(cd "$tmp/check out" && sbatch --parsable --chdir="$tmp/j1" --output="$tmp/job-%j.out" --time=5 \
  launch/slurm/dptrain.sbatch --model lenet --epochs 1 --max-steps 5 --batch-size 64 --eval-batch-size 2000 \
  --data "$data" --metrics "$metrics") || fail "sbatch failed"
jobid=${jobid%%;*}
log "submitted job $jobid"

job_state() { scontrol show job -o "$jobid" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_done() {
  case $(job_state) in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) return 0 ;;
  esac
  return 1
}
wait_for 60 job_done || {
  scancel "$jobid" 2>/dev/null
  fail "job $jobid not finished within 60 s (state $(job_state))"
}
log "job $jobid finished"
echo "---- job output ----"
cat "$tmp/job-$jobid.out"
echo "--------------------"

# ---- checks ----
state="" exit_code="" source=""
if acct=$(sacct -n -X -P -j "$jobid" -o State,ExitCode 2>/dev/null) && [[ -n $acct ]]; then
  state=${acct%%|*}
  exit_code=${acct#*|}
  source="sacct"
else
  info=$(scontrol show job -o "$jobid") || fail "scontrol show job $jobid failed"
  state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2)
  exit_code=$(grep -o ' ExitCode=[0-9:]*' <<<"$info" | cut -d= -f2)
  source="scontrol show job (accounting storage is disabled on this test cluster)"
fi
state=${state%% *}
echo "check: job state via $source: $state, exit code $exit_code"
[[ $state == COMPLETED ]] || fail "job $jobid state is '$state', not COMPLETED"
[[ $exit_code == 0:0 ]] || fail "job $jobid exit code is '$exit_code', not 0:0"
if [[ -f $tmp/log/jobcomp.txt ]]; then
  rec=$(grep "JobId=$jobid " "$tmp/log/jobcomp.txt")
  comp="$(grep -o 'JobState=[A-Z_]*' <<<"$rec") $(grep -o ' ExitCode=[0-9:]*' <<<"$rec")"
  echo "check: job completion log: ${comp:-none}"
  grep -q 'JobState=COMPLETED' <<<"$rec" ||
    fail "job completion log has no COMPLETED record for job $jobid"
fi

[[ -s $metrics ]] || fail "no metrics file $metrics"
line=$(tail -n 1 "$metrics")
echo "check: metrics line: $line"
grep -Eq '"world_size": ?2[,}]' <<<"$line" || fail "metrics line lacks \"world_size\": 2"
grep -Eq '"test_count": ?10000[,}]' <<<"$line" || fail "metrics line lacks \"test_count\": 10000"
echo "check: world_size 2 and test_count 10000 in the metrics"
grep -q 'world size 2' "$tmp/job-$jobid.out" || fail "job output lacks 'world size 2'"
grep -qF "dptrain.sbatch: warning: the job's time limit" "$tmp/job-$jobid.out" &&
  fail "a warning of a short time limit under --time=5 (300 s against the 120 s lead)"
echo "check: job output says 'world size 2'"

log "PASS: Slurm job $jobid ran dptrain on 2 ranks via srun --mpi=pmix"

# ---- the time-limit warning: SIGUSR1 mid-run, checkpoint, requeue, resume; bit for bit ----
# What Slurm sends 120 s before the limit (#SBATCH --signal=USR1@120) is sent here at once with
# scancel --signal=USR1, which signals the job's steps: the ranks.
run2=(--model lenet --epochs 2 --max-steps 100 --batch-size 64 --eval-batch-size 2000 --data "$data"
      --checkpoint-every 10steps)
mkdir -p "$tmp/ref" "$tmp/j2"
OMPI_MCA_pml=ob1 timeout -k 5 200 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$DPTRAIN" \
  "${run2[@]}" --threads 1 --checkpoint-path "$tmp/ref/ck.st" --save "$tmp/ref/final.st" >"$tmp/ref.log" 2>&1 ||
  fail "the uninterrupted reference run failed: $(tail -3 "$tmp/ref.log")"
# DPT_MAX_REQUEUES=08 is 8: it failed the script's arithmetic at the signal (no requeue).
jobid=$(DPT_MAX_REQUEUES=08 sbatch --parsable --chdir="$tmp/j2" --output="$tmp/job-%j.out" --time=5 \
  "$script" "${run2[@]}" --checkpoint-path "$tmp/j2/ck.st" --save "$tmp/j2/final.st") || fail "sbatch failed"
jobid=${jobid%%;*}
log "submitted job $jobid; waiting for its first checkpoint"
wait_for 90 test -f "$tmp/j2/ck.st" || fail "job $jobid wrote no checkpoint within 90 s (state $(job_state))"
scancel --signal=USR1 "$jobid" || fail "scancel --signal=USR1 $jobid failed"
log "sent SIGUSR1 to the steps of job $jobid"
# Requeued: it leaves RUNNING, comes back and completes (job_done is not true for a requeue).
# Slurm holds a requeued job back for a while (its BeginTime is set into the future): once it is
# pending again, it is let go at once, to keep the test short.
# job_report: job $jobid's output, then its state, exit code and restarts (set as globals).
job_report() {
  echo "---- job output ----"
  cat "$tmp/job-$jobid.out"
  echo "--------------------"
  local info
  info=$(scontrol show job -o "$jobid")
  state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2)
  restarts=$(grep -o 'Restarts=[0-9]*' <<<"$info" | cut -d= -f2)
  exit_code=$(grep -o ' ExitCode=[0-9:]*' <<<"$info" | cut -d= -f2)
  echo "check: job $jobid: state $state, exit code $exit_code, restarts $restarts"
}
requeued() { scontrol show job -o "$jobid" | grep -q 'Restarts=1 .*JobState=PENDING\|JobState=PENDING.*Restarts=1'; }
if wait_for 60 requeued; then
  log "job $jobid requeued: $(scontrol show job -o "$jobid" | grep -o 'JobState=[A-Z]* Reason=[^ ]*\|BeginTime=[^ ]*' | tr '\n' ' ')"
  scontrol update JobId="$jobid" StartTime=now || true
fi
wait_for 180 job_done || fail "job $jobid not finished within 180 s of the signal (state $(job_state))"
job_report
[[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job $jobid: state $state exit code $exit_code, want COMPLETED 0:0"
[[ $restarts == 1 ]] || fail "job $jobid was requeued ${restarts:-?} times, want 1"
out=$tmp/job-$jobid.out
grep -q "SIGUSR1: checkpoint of epoch" "$out" || fail "no stop checkpoint in the job output"
grep -q "requeueing job $jobid" "$out" || fail "the script did not requeue"
grep -q "resumed from $tmp/j2/ck.st" "$out" || fail "the requeued job did not resume from the checkpoint"
python3 "$repo/tests/cli/same_tensors.py" "$tmp/ref/final.st" "$tmp/j2/final.st" ||
  fail "the requeued job does not end where the uninterrupted run ends"
log "PASS: job $jobid stopped on SIGUSR1 with a checkpoint, requeued itself and ended bit for bit"

# ---- the same signal with --checkpoint-every 0: no checkpoint, so no requeue ----
# A requeue would start the job again from scratch, up to DPT_MAX_REQUEUES times. The signal is
# sent once the job has trained a step (its first step record in --metrics).
# submit_until_step DIR FLAGS...: submits the script with FLAGS, outputs in DIR, a step record each
# step, and waits for the first one ($jobid).
submit_until_step() {
  local dir=$1
  shift
  mkdir -p "$dir"
  jobid=$(sbatch --parsable --chdir="$dir" --output="$tmp/job-%j.out" --time=5 \
    "$script" "$@" --checkpoint-path "$dir/ck.st" --metrics "$dir/m.jsonl" --metrics-every 1) ||
    fail "sbatch failed"
  jobid=${jobid%%;*}
  log "submitted job $jobid ($*); waiting for its first step"
  wait_for 90 grep -q '"type":"step"' "$dir/m.jsonl" ||
    fail "job $jobid trained no step within 90 s (state $(job_state))"
}
# The signal goes to the batch script alone (scancel --batch, as `sbatch --signal=B:USR1@300` sends
# it), which passes it on to the ranks: bash died of it (FAILED 0:10), the ranks never told.
submit_until_step "$tmp/j3" "${run2[@]/10steps/0}"
scancel --batch --signal=USR1 "$jobid" || fail "scancel --batch --signal=USR1 $jobid failed"
log "sent SIGUSR1 to the batch script of job $jobid"
wait_for 60 job_done || fail "job $jobid not finished within 60 s of the signal (state $(job_state))"
# A requeue that was made would show within a second or two: give it the time.
sleep 3
job_report
out=$tmp/job-$jobid.out
grep -q "SIGUSR1 to the batch script: passing it on to the ranks" "$out" ||
  fail "the batch script did not pass its SIGUSR1 on to the ranks"
grep -q "without a checkpoint" "$out" || fail "the ranks did not say they stopped without a checkpoint"
grep -q "; requeueing job $jobid" "$out" && fail "the script requeued job $jobid, which wrote no checkpoint"
grep -q "without writing a checkpoint (--checkpoint-every 0, or the warning came during the start-up, .*): not requeueing job $jobid" "$out" ||
  fail "the script did not say why it does not requeue"
[[ $restarts == 0 ]] || fail "job $jobid was requeued ${restarts:-?} times, want 0"
[[ $state == FAILED && $exit_code == 138:0 ]] || fail "job $jobid: state $state exit code $exit_code, want FAILED 138:0"
compgen -G "$tmp/j3/ck*" >/dev/null && fail "job $jobid wrote a checkpoint: $(ls "$tmp/j3")"
log "PASS: job $jobid stopped on SIGUSR1 without a checkpoint and was not requeued"

# ---- scancel mid-run: the ranks write their checkpoint, the script waits for them ----
# A cancel signals the batch shell as well: it used to leave at once and remove the record file
# under rank 0, which then warned that it could not append its checkpoint's record.
submit_until_step "$tmp/j4" "${run2[@]}"
scancel "$jobid" || fail "scancel $jobid failed"
log "cancelled job $jobid"
wait_for 60 job_done || fail "job $jobid not finished within 60 s of scancel (state $(job_state))"
sleep 2  # the output's last lines
job_report
out=$tmp/job-$jobid.out
grep -q "SIGTERM: checkpoint of epoch" "$out" || fail "no stop checkpoint in the output of the cancelled job"
grep -q "cannot append the checkpoint's record" "$out" &&
  fail "rank 0 lost the checkpoint's record: the script left before the ranks stopped"
grep -q "dptrain.sbatch: SIGTERM: waiting for the ranks" "$out" || fail "the script did not wait for the ranks"
[[ $restarts == 0 ]] || fail "the cancelled job $jobid was requeued"
log "PASS: job $jobid cancelled: checkpoint written and recorded, the script waited for the ranks"

# ---- a wrong DPTRAIN: exit 2 naming it and what is wrong ----
# A missing one was "binary not found ... Build it first, or set DPTRAIN" (it was set), a directory
# "not found".
# quick_job DIR FLAGS...: submits the script with FLAGS and waits for its end (a job that fails at once).
quick_job() {
  local dir=$1
  shift
  mkdir -p "$dir"
  jobid=$(sbatch --parsable --chdir="$dir" --output="$tmp/job-%j.out" --time="${qtime:-5}" "$script" "$@") ||
    fail "sbatch failed"
  jobid=${jobid%%;*}
  wait_for 60 job_done || fail "job $jobid not finished within 60 s (state $(job_state))"
  job_report
}
DPTRAIN=$tmp/no/dptrain quick_job "$tmp/j5" --model lenet
grep -qF "dptrain.sbatch: error: DPTRAIN='$tmp/no/dptrain': no such file (unset DPTRAIN" "$tmp/job-$jobid.out" ||
  fail "a missing DPTRAIN is not named"
[[ $state == FAILED && $exit_code == 2:0 ]] || fail "job $jobid: state $state exit code $exit_code, want FAILED 2:0"
DPTRAIN=$tmp quick_job "$tmp/j6" --model lenet
grep -qF "dptrain.sbatch: error: DPTRAIN='$tmp' is a directory, not the dptrain program" "$tmp/job-$jobid.out" ||
  fail "a DPTRAIN that is a directory is not named"
[[ $state == FAILED && $exit_code == 2:0 ]] || fail "job $jobid: state $state exit code $exit_code, want FAILED 2:0"
log "PASS: a missing DPTRAIN and one that is a directory: exit 2, named"
DPT_MAX_REQUEUES=100000 quick_job "$tmp/j8" --model lenet
grep -qF "dptrain.sbatch: error: DPT_MAX_REQUEUES='100000' is not a whole number from 0 to 9999" "$tmp/job-$jobid.out" ||
  fail "DPT_MAX_REQUEUES=100000 is not refused"
[[ $state == FAILED && $exit_code == 2:0 ]] || fail "job $jobid: state $state exit code $exit_code, want FAILED 2:0"

# ---- hostile arguments reach dptrain as words, and the script's log shows them so ----
# The srun line it printed joined the words with spaces: "--model lenet; touch .../PWNED".
# Under --time=2 (120 s, no longer than the script's 120 s warning lead): each run would be cut at
# its first checkpoint ~25 s in and requeued, which the script says at the start (it did not).
qtime=2 quick_job "$tmp/j7" --model "lenet; touch $tmp/PWNED" --metrics "$tmp/a b \"q\" 'x'.jsonl"
out=$tmp/job-$jobid.out
grep -qF "dptrain.sbatch: warning: the job's time limit (TimeLimit=00:02:00, 120 s) leaves 0 s before the time-limit warning this script asks for (--signal=USR1@120" "$out" ||
  fail "no warning of a time limit no longer than the warning's lead: $(grep -F 'dptrain.sbatch' "$out")"
grep -qF "unknown model 'lenet; touch $tmp/PWNED'" "$out" || fail "dptrain did not get --model as one word"
grep -qF " --model lenet\;\ touch\ $tmp/PWNED --metrics $tmp/a\ b\ \\\"q\\\"\ \\'x\\'.jsonl " "$out" ||
  fail "the script's srun line does not quote the arguments: $(grep 'srun --mpi' "$out")"
[[ -e $tmp/PWNED ]] && fail "an argument ran as a command: $tmp/PWNED exists"
[[ $state == FAILED && $exit_code == 2:0 ]] || fail "job $jobid: state $state exit code $exit_code, want FAILED 2:0"
log "PASS: hostile arguments: one word each, quoted in the log, nothing run"
exit 0
