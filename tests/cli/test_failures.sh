#!/usr/bin/env bash
# Failing ranks never hang the job: a rank stopped with SIGSTOP makes every rank end within
# --timeout plus a few seconds with a message naming the lagging rank; a rank killed with
# SIGKILL ends the job; SIGTERM stops every rank cleanly at an agreed step after writing a
# checkpoint, and resuming from it ends bit for bit where an uninterrupted run ends; during the
# start-up (a peer stopped before MPI_Init) it ends the job at once. A rank stopped in MPI_Init,
# just after it, or in MPI_Finalize is bounded by --timeout too.
# Usage: test_failures.sh path/to/dptrain
set -uo pipefail
bin=$(realpath "$1")
tmp=$(mktemp -d)
job=""
cleanup() {
  [[ -n $job ]] && kill -CONT $(pgrep -P "$job") 2>/dev/null
  [[ -n $job ]] && kill -9 "$job" $(pgrep -P "$job") 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
mpi=(mpirun -np 2 --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
common=(--model lenet --batch-size 64 --eval-batch-size 2000 --seed 3)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Starts a 2-rank job in the background (its mpirun pid in $job), waits for training to begin.
start() {
  "${mpi[@]}" "$bin" "${common[@]}" "$@" > "$tmp/out" 2>&1 &
  job=$!
  for _ in $(seq 200); do
    grep -q "^configuration:" "$tmp/out" 2>/dev/null && break
    sleep 0.1
  done
  sleep 1
}
rank_pid() {  # pid of world rank $1 among the job's children
  local p
  for p in $(pgrep -P "$job"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
finish() {  # waits for the job at most $1 s; sets rc and elapsed
  local t0=$SECONDS
  rc=124
  for _ in $(seq $(($1 * 10))); do
    if ! kill -0 "$job" 2>/dev/null; then wait "$job"; rc=$?; break; fi
    sleep 0.1
  done
  elapsed=$((SECONDS - t0))
  job_done=$job
  job=""
  [[ $rc -eq 124 ]] && kill -9 "$job_done" $(pgrep -P "$job_done") 2>/dev/null
}

echo "== SIGSTOP of rank 1 with --timeout 5"
start --epochs 20 --timeout 5
p=$(rank_pid 1)
[[ -n $p ]] || fail "no rank 1 process found"
kill -STOP "$p"
finish 30
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "job did not end with an error (rc $rc)"
((elapsed <= 20)) || fail "job took ${elapsed}s to end after the stop (timeout 5)"
grep -q "did not complete within --timeout 5" "$tmp/out" || fail "no timeout message"
grep -q "rank(s) 1 did not answer" "$tmp/out" || fail "the stopped rank is not named"
# The communication thread, still blocked in the all-reduce, must not crash once the abort wakes it
# (it did in 2 of 5 runs when its transport was destroyed under it).
grep -E "Segmentation fault|Signal: |Aborted" "$tmp/out" && fail "a rank crashed after the timeout"
grep -E "timeout|did not answer" "$tmp/out" | head -2
echo "rc $rc after ${elapsed}s"

echo "== every rank stopped for longer than --timeout 3, then continued (a suspended job)"
# Ctrl-Z under mpirun (which forwards SIGTSTP to the ranks), Slurm's scontrol suspend, a debugger:
# the whole job stops and later goes on. The steady clock counts the stopped time, so each rank's
# pending all-reduce "timed out" on its first look at the clock after SIGCONT: exit 3, "every rank
# answered and none is behind". Time a rank spent stopped itself is no wait: the job goes on.
# Rank 1 is slowed (DPT_FAULT_SLOW_RANK) so that rank 0 is waiting in an all-reduce at the stop.
DPT_FAULT_SLOW_RANK=1:20 start --epochs 1 --max-steps 40 --eval-every 0 --timeout 3
pids=$(pgrep -P "$job")
[[ -n $pids ]] || fail "no rank processes found"
kill -STOP $pids
sleep 6
kill -CONT $pids
finish 60
[[ $rc -eq 0 ]] || { fail "a job suspended for 6 s under --timeout 3 ended with exit $rc"; grep -m2 "error" "$tmp/out"; }
grep -q "epoch 1/1" "$tmp/out" || fail "the suspended job did not finish its epoch"
echo "rc $rc after ${elapsed}s"

echo "== rank 1 stopped after the last collective, in MPI_Finalize (--timeout 3)"
# Open MPI's MPI_Finalize waits for every rank without limit: a rank stopped there (or a host cut
# off) held rank 0 and mpirun for ever after a finished run. A preloaded MPI_Finalize stops rank 1
# at that very point; the job must end, rank 0 saying why, with its --save written.
if command -v mpicc >/dev/null; then
  cat > "$tmp/stop_finalize.c" <<'EOF2'
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
int MPI_Finalize(void) {
  const char *rank = getenv("OMPI_COMM_WORLD_RANK"), *stop = getenv("STOP_RANK");
  if (rank && stop && strcmp(rank, stop) == 0) raise(SIGSTOP);
  return PMPI_Finalize();
}
EOF2
  if mpicc -shared -fPIC -o "$tmp/stop_finalize.so" "$tmp/stop_finalize.c" 2> "$tmp/cc.err"; then
    "${mpi[@]}" -x LD_PRELOAD="$tmp/stop_finalize.so" -x STOP_RANK=1 "$bin" "${common[@]}" \
      --epochs 1 --max-steps 3 --eval-every 0 --timeout 3 --save "$tmp/fin.safetensors" > "$tmp/out" 2>&1 &
    job=$!
    finish 60
    [[ $rc -ne 124 ]] || fail "the job still ran 60 s after rank 1 stopped in MPI_Finalize (--timeout 3)"
    grep -q "rank 0@.*MPI_Finalize did not complete within --timeout 3 s" "$tmp/out" ||
      fail "rank 0 did not say that MPI_Finalize timed out: $(tail -3 "$tmp/out")"
    [[ -s $tmp/fin.safetensors ]] || fail "--save was not written"
    grep -m1 "MPI_Finalize" "$tmp/out"
    echo "rc $rc"
  else
    echo "skipped: mpicc cannot build the preloaded MPI_Finalize ($(head -1 "$tmp/cc.err"))"
  fi
else
  echo "skipped: no mpicc to build the preloaded MPI_Finalize"
fi

echo "== rank 1 stopped just after MPI_Init, at each blocking step before the run's collectives (--timeout 4)"
# Between MPI_Init and the first polled collective, the ranks met in calls that block in MPI (the
# split by host, the communicator's duplicates and host all-gather) and in the flags' all-reduce,
# which ran before --timeout was set: rank 1 stopped at any of them held rank 0 there for ever.
# Each must end the job within --timeout, rank 0 saying where, with exit 3. --timeout 4, not less:
# it also bounds both ranks' MPI_Init, which a loaded 2-core machine can take seconds over.
if command -v mpicc >/dev/null; then
  cat > "$tmp/stop_at.c" <<'EOF2'
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
/* Stops rank STOP_RANK at STOP_AT: after MPI_Init, before its first MPI_Comm_dup or Iallreduce. */
static void stop_if(const char *at) {
  const char *rank = getenv("OMPI_COMM_WORLD_RANK"), *stop = getenv("STOP_RANK");
  const char *where = getenv("STOP_AT");
  if (rank && stop && where && !strcmp(rank, stop) && !strcmp(where, at)) raise(SIGSTOP);
}
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
  int rc = PMPI_Init_thread(argc, argv, required, provided);
  stop_if("init");
  return rc;
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *out) {
  stop_if("dup");
  return PMPI_Comm_dup(comm, out);
}
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request *q) {
  stop_if("allreduce");
  return PMPI_Iallreduce(s, r, n, t, op, c, q);
}
EOF2
  if mpicc -shared -fPIC -o "$tmp/stop_at.so" "$tmp/stop_at.c" 2> "$tmp/cc.err"; then
    for at in "init:first collective after MPI_Init (grouping them by host) did not complete within --timeout 4 s" \
      "dup:the set-up of a communicator (MPI_Comm_dup and an all-gather of the host names, over every rank) did not complete within --timeout 4 s" \
      "allreduce:all-reduce of the flag errors did not complete within --timeout 4 s on rank 0: rank(s) 1 did not answer"; do
      "${mpi[@]}" -x LD_PRELOAD="$tmp/stop_at.so" -x STOP_RANK=1 -x STOP_AT="${at%%:*}" "$bin" \
        "${common[@]}" --epochs 1 --max-steps 3 --timeout 4 > "$tmp/out" 2>&1 &
      job=$!
      finish 30
      [[ $rc -eq 3 ]] || fail "rank 1 stopped at ${at%%:*}: exit $rc, want 3 (124: still running after 30 s)"
      grep -q "rank 0@.*${at#*:}" "$tmp/out" ||
        fail "rank 1 stopped at ${at%%:*}: rank 0 did not say where it waited: $(grep -m1 error "$tmp/out")"
      echo "rank 1 stopped at ${at%%:*}: rc $rc after ${elapsed}s"
    done
  else
    echo "skipped: mpicc cannot build the preloaded stops ($(head -1 "$tmp/cc.err"))"
  fi
else
  echo "skipped: no mpicc to build the preloaded stops"
fi

echo "== rank 1 stopped before MPI_Init (--timeout 3)"
# Open MPI's MPI_Init waits for every rank of the job without limit: a rank stopped before it (here
# by a wrapper, before dptrain even runs), or one never started, held rank 0 there for ever. Rank 0
# must end the job within --timeout, saying why, with exit 3.
printf '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -STOP $$\nexec "$@"\n' > "$tmp/stop_rank1.sh"
chmod +x "$tmp/stop_rank1.sh"
"${mpi[@]}" "$tmp/stop_rank1.sh" "$bin" "${common[@]}" --epochs 1 --max-steps 3 --timeout 3 \
  > "$tmp/out" 2>&1 &
job=$!
finish 60
[[ $rc -ne 124 ]] || fail "the job still ran 60 s after rank 1 stopped before MPI_Init (--timeout 3)"
[[ $rc -ne 0 ]] || fail "the job ended with 0 though rank 1 never started"
((elapsed <= 20)) || fail "job took ${elapsed}s to end (timeout 3)"
grep -q "rank 0@.*MPI_Init did not complete within --timeout 3 s" "$tmp/out" ||
  fail "rank 0 did not say that MPI_Init timed out: $(tail -3 "$tmp/out")"
grep -m1 "MPI_Init" "$tmp/out"
echo "rc $rc after ${elapsed}s"

echo "== SIGTERM to rank 0 while it waits in MPI_Init for a stopped rank 1: the job ends at once"
# The start-up trains and writes nothing, but a stop signal was held until the first step: rank 0
# took SIGTERM only once --timeout had ended its wait, with exit 3 (30 s here). Now the start-up
# ends the job at once, exit 128 + signal, saying so.
"${mpi[@]}" "$tmp/stop_rank1.sh" "$bin" "${common[@]}" --epochs 1 --max-steps 3 --timeout 30 \
  > "$tmp/out" 2>&1 &
job=$!
# Sent once rank 0's main has blocked the stop signals (SIGTERM, bit 15 of SigBlk), its watcher
# then taking them: before that, while a loaded machine still loads its libraries, SIGTERM's default
# action kills it without a word, and a fixed sleep could be too short.
p=""
for _ in $(seq 300); do
  p=$(rank_pid 0)
  [[ -n $p ]] && grep -q dptrain "/proc/$p/cmdline" 2>/dev/null &&
    (($(printf '%d' "0x$(awk '/^SigBlk:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)") & 1 << 14)) && break
  sleep 0.1
done
sleep 0.5
kill -TERM "$p"
finish 60
[[ $rc -eq 143 ]] || fail "SIGTERM to rank 0 in MPI_Init: exit $rc, want 143: $(tail -3 "$tmp/out")"
((elapsed <= 10)) || fail "SIGTERM to rank 0 in MPI_Init: the job took ${elapsed}s to end (--timeout 30)"
grep -q "rank 0@.*stopped by SIGTERM before anything was written: the start-up has nothing to save" \
  "$tmp/out" || fail "rank 0 did not say why it stopped: $(grep -v '^ *$' "$tmp/out" | head -3)"
echo "rc $rc after ${elapsed}s"

echo "== a --timeout shorter than MPI's start-up, in a job of one process: exit 3, said so"
# It was blamed on "another rank of the job has not reached it", in a job that has no other rank.
for how in alone mpirun; do
  before=$fails
  if [[ $how == alone ]]; then
    "$bin" "${common[@]}" --epochs 1 --max-steps 1 --timeout 0.000001 >"$tmp/out" 2>&1
  else # mpi's words with -np 1
    "${mpi[@]/#2/1}" "$bin" "${common[@]}" --epochs 1 --max-steps 1 --timeout 0.000001 >"$tmp/out" 2>&1
  fi
  rc=$?
  [[ $rc -eq 3 ]] || fail "$how, --timeout 0.000001: exit $rc, want 3: $(tail -2 "$tmp/out")"
  grep -q "MPI_Init did not complete within --timeout 1e-06 s in a job of one process, which has no other rank to wait for" "$tmp/out" ||
    fail "$how, --timeout 0.000001: not said as a job of one process: $(grep -m1 error "$tmp/out")"
  grep -q "another rank of the job" "$tmp/out" && fail "$how: blamed on another rank of a one-process job"
  ((fails == before)) && echo "ok: $how: a --timeout shorter than MPI_Init in a one-process job is said as such (exit $rc)"
done

echo "== a rank that reads its data slower than the others, by more than --timeout"
# A cold cache or a slower disk on one host: the ranks' agreement after the read waited --timeout
# for it, and a rank still reading was taken for a dead one ("did not answer ... stopped, dead or
# unreachable"), exit 3. It now waits as long again as the read took the rank that waits. strace
# delays the second open of the training images (the read; the first sizes the set): rank 0's by
# 8 s, rank 1's by 12 s, under --timeout 3 (4 s apart, past --timeout; 3 + ~8 s of grace leave
# 7 s for rank 1's read to be slower under strace on a loaded machine); then, rank 0's by 2 s and
# rank 1's by 25 s, past the 3 + ~2 s (rank 0's delay only makes the grace: 2 s keep it over the
# 1 s a grace needs, and the failing case ends 6 s sooner than at 8 s).
data=/usr/share/datasets/fashion-mnist
delayed() {  # strace arguments: the data read's open delayed by $1
  echo strace -o /dev/null -qq -f -P "$data/train-images-idx3-ubyte.gz" -e trace=openat \
    -e "inject=openat:delay_enter=$1:when=2"
}
if ! command -v strace > /dev/null || ! strace -o /dev/null -qq true 2> /dev/null; then
  echo "skip: strace is missing or cannot trace here"
else
  slow=(--epochs 1 --max-steps 2 --eval-every 0 --timeout 3)
  # shellcheck disable=SC2046  # delayed's words are the arguments
  timeout -k 5 60 "${mpi[0]}" "${mpi[@]:3}" -np 1 $(delayed 8s) "$bin" "${common[@]}" "${slow[@]}" : \
    -np 1 $(delayed 12s) "$bin" "${common[@]}" "${slow[@]}" > "$tmp/slow.out" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || fail "a rank 4 s slower reading its data under --timeout 3: exit $rc: $(grep error "$tmp/slow.out" | head -1)"
  echo "rank 1 reading 4 s longer than rank 0, --timeout 3: exit $rc"
  # shellcheck disable=SC2046
  timeout -k 5 60 "${mpi[0]}" "${mpi[@]:3}" -np 1 $(delayed 2s) "$bin" "${common[@]}" "${slow[@]}" : \
    -np 1 $(delayed 25s) "$bin" "${common[@]}" "${slow[@]}" > "$tmp/slow.out" 2>&1
  rc=$?
  grep -q "error: the ranks' agreement after reading --data $data (an all-reduce) did not complete within --timeout 3 s + [0-9.]* s (the time this rank took reading --data $data, which another rank may still be doing) on rank 0: rank(s) 1 did not answer" "$tmp/slow.out" ||
    fail "a rank 23 s slower reading its data: exit $rc, not the message: $(grep error "$tmp/slow.out" | head -1)"
  grep -m1 -o "error: the ranks' agreement.*" "$tmp/slow.out" | cut -c1-160
fi

echo "== started by hand in a Slurm allocation of 2 tasks (a salloc -n 2 shell): said, with how to start it"
# The variables of a `salloc -n 2` shell (recorded on the one-node cluster of tests/slurm): a
# process started there by hand, not by srun (which adds SLURM_STEP_ID, SLURM_PROCID, PMIX_RANK),
# is an MPI singleton. MPI_Init's timeout blamed "another rank of the job" (SLURM_NTASKS=2), and a
# run trained alone, world size 1, without a word.
salloc_env=(SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_JOB_NAME=interactive SLURM_NNODES=1
  SLURM_JOB_NUM_NODES=1 "SLURM_NODELIST=$(hostname -s)" "SLURM_JOB_NODELIST=$(hostname -s)"
  SLURM_TASKS_PER_NODE=2 SLURM_JOB_CPUS_PER_NODE=2 SLURM_NTASKS=2 SLURM_NPROCS=2)
unset_launchers=(-u SLURM_STEP_ID -u SLURM_PROCID -u PMIX_RANK -u PMI_RANK -u OMPI_COMM_WORLD_SIZE)
alone="started inside Slurm job 4242, an allocation of 2 tasks (SLURM_NTASKS), but not by srun"
how_to="srun --mpi=pmix build/dptrain ..., submit sbatch launch/slurm/dptrain.sbatch ..., or run launch/mpirun.sh -np 2"
before=$fails
env "${unset_launchers[@]}" "${salloc_env[@]}" "$bin" "${common[@]}" --epochs 1 --timeout 0.000001 \
  >"$tmp/out" 2>&1
rc=$?
[[ $rc -eq 3 ]] || fail "salloc shell, --timeout 0.000001: exit $rc, want 3: $(tail -2 "$tmp/out")"
grep -q "MPI_Init did not complete within --timeout 1e-06 s in a job of one process" "$tmp/out" ||
  fail "salloc shell: not said as a job of one process: $(grep -m1 error "$tmp/out")"
{ grep -qF "$alone" "$tmp/out" && grep -qF "$how_to" "$tmp/out"; } ||
  fail "salloc shell: the MPI_Init timeout does not say it was not started by srun, and how: $(grep -m1 error "$tmp/out")"
grep -q "another rank of the job" "$tmp/out" && fail "salloc shell: blamed on another rank"
# A batch script's own variables add SLURM_PROCID=0 (no step): the same. The run goes on alone.
env "${unset_launchers[@]}" "${salloc_env[@]}" SLURM_PROCID=0 "$bin" "${common[@]}" \
  --data synthetic:28x28x1:64:2 --epochs 1 --eval-every 0 >"$tmp/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "batch script, a short run: exit $rc: $(tail -2 "$tmp/out")"
grep "warn" "$tmp/out" | grep -qF "$alone" ||
  fail "batch script: the run alone in a 2-task allocation gave no warning: $(head -3 "$tmp/out")"
grep -q "world size 1" "$tmp/out" || fail "batch script: not a run of world size 1: $(head -2 "$tmp/out")"
# Outside an allocation, and in a one-task one, nothing is said.
for extra in "" "SLURM_NTASKS=1"; do
  env "${unset_launchers[@]}" ${extra:+"${salloc_env[@]}" "$extra"} "$bin" "${common[@]}" \
    --data synthetic:28x28x1:64:2 --epochs 1 --eval-every 0 >"$tmp/out" 2>&1
  grep -q "not by srun" "$tmp/out" && fail "'$extra': warned of a Slurm allocation: $(grep -m1 srun "$tmp/out")"
done
((fails == before)) && echo "ok: started by hand in a Slurm allocation of 2 tasks: said, and how to start its ranks"

echo "== SIGKILL of rank 1"
start --epochs 20 --timeout 30
p=$(rank_pid 1)
kill -9 "$p"
finish 30
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "job did not end with an error (rc $rc)"
((elapsed <= 15)) || fail "job took ${elapsed}s to end after the kill"
echo "rc $rc after ${elapsed}s"

echo "== SIGTERM with checkpoints, then resume"
run=(--epochs 2 --max-steps 200 --checkpoint-every 1 --checkpoint-path "$tmp/ckpt.safetensors")
timeout -k 5 300 "${mpi[@]}" "$bin" "${common[@]}" "${run[@]}" --save "$tmp/full.safetensors" > "$tmp/full.out" 2>&1 \
  || fail "uninterrupted run failed: $(tail -3 "$tmp/full.out")"
rm -f "$tmp/ckpt.safetensors"
start "${run[@]}"
kill -TERM $(pgrep -P "$job")
finish 60
[[ $rc -eq 143 ]] || fail "SIGTERM: exit code $rc, expected 143"
grep -q "checkpoint of epoch" "$tmp/out" || fail "no checkpoint written on SIGTERM"
grep -q "stopped by SIGTERM" "$tmp/out" || fail "no stop message"
grep -E "checkpoint of epoch|stopped by" "$tmp/out" | head -2
timeout -k 5 300 "${mpi[@]}" "$bin" "${common[@]}" "${run[@]}" --resume "$tmp/ckpt.safetensors" \
  --save "$tmp/resumed.safetensors" > "$tmp/resumed.out" 2>&1 || fail "resume failed: $(tail -3 "$tmp/resumed.out")"
grep -q "resumed from" "$tmp/resumed.out" || fail "no resume message"
python3 "$(dirname "$0")/same_tensors.py" "$tmp/full.safetensors" "$tmp/resumed.safetensors" \
  || fail "resumed run differs from the uninterrupted one"

echo "failures: $fails"
[[ $fails -eq 0 ]]
