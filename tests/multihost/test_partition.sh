#!/usr/bin/env bash
# Faults end in bounded time on every host (meson suite `multihost`): dptrain through
# launch/mpirun.sh across the two network-namespace hosts of lib.sh (mpirun and rank 0 on the
# first, rank 1 on the second) while the link between them fails:
#  partition: the link goes down mid-training (--timeout 8). Within --timeout + 30 s the launcher
#    has returned with a failure (3 when it ended mpirun itself) leaving nothing on the first host,
#    rank 0's message names rank 1 and its host, and each rank has ended by itself with exit 3;
#    the second host's daemon (cut off from the ended mpirun) ends once the link is back;
#  stalled daemon: the same with the second host's Open MPI daemon stopped too, so that its rank's
#    MPI_Abort cannot complete: dptrain's own bound ends that rank, exit 3;
#  outage: the link down for 4 s under --timeout 20: training goes on, the launcher exits 0;
#  sigterm: SIGTERM to the launcher: exit 143 after a checkpoint, and no rank left on the first
#    host when it returns (nor, moments later, on the second);
#  sigterm-crash: SIGTERM to the launcher while mpirun is stopped, then mpirun killed: mpirun is gone
#    before its ranks (Open MPI's ranks notice a lost mpirun a second later), as when it counts a
#    rank it SIGKILLed as ended at once or crashes in its abort path. The launcher exits 143 and
#    only once the rank on its host has ended.
# Usage: test_partition.sh path/to/dptrain [CASE...] (partition stalled-daemon outage sigterm
#        sigterm-crash; all by default)
# Exit: 0 pass, 1 fail, 77 skip (meson's skip code) with the reason, as lib.sh decides.
set -euo pipefail
# shellcheck source=tests/multihost/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launcher=$(cd "$here/../../launch" && pwd)/mpirun.sh
rank_name=$(basename "$dptrain" | cut -c1-15) # a rank's command name (/proc/PID/comm)

# The launcher starts the second host's daemon through the agent, and every rank talks over the veth.
export OMPI_MCA_plm=rsh OMPI_MCA_plm_rsh_agent=$agent OMPI_MCA_plm_rsh_no_tree_spawn=1 \
  OMPI_MCA_btl_tcp_if_include=10.200.0.0/24 OMPI_MCA_oob_tcp_if_include=10.200.0.0/24
printf '%s slots=1\n%s slots=1\n' "$ipA" "$ipB" >"$tmp/hostfile"

# Runs a rank and records how it ended, "rank R exit CODE" in $tmp/exits; a rank killed (with its
# wrapper) records nothing. The wrapper ignores SIGTERM: Open MPI sends it to an aborting rank's
# process group, and the rank's own exit code is what is checked.
rank_wrapper=$tmp/rank.sh
cat >"$rank_wrapper" <<EOF
#!/bin/sh
trap '' TERM
"\$@"
rc=\$?
echo "rank \$OMPI_COMM_WORLD_RANK exit \$rc" >>"$tmp/exits"
exit \$rc
EOF
chmod +x "$rank_wrapper"

now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
link() { ip -n "$nsA" link set vethA "$1"; }

# start_job NAME STEPS PROGRAM [ARGS...]: the launcher on the first host in the background ($job,
# output in $tmp/NAME.log), 2 ranks of PROGRAM training LeNet; returns once STEPS steps are done.
start_job() {
  local name=$1 steps=$2
  shift 2
  out_file=$tmp/$name.log
  "${on_host_a[@]}" bash "$launcher" --hostfile "$tmp/hostfile" -np 2 -x OMP_NUM_THREADS=1 "$@" \
    --model lenet --batch-size 64 --eval-batch-size 2000 --metrics "$tmp/$name.jsonl" --metrics-every 1 \
    </dev/null >"$out_file" 2>&1 &
  job=$!
  for ((i = 0; i < 600; i++)); do
    [[ -f $tmp/$name.jsonl && $(wc -l <"$tmp/$name.jsonl") -ge $steps ]] && return 0
    kill -0 "$job" 2>/dev/null || fail "$name: the launcher ended before training started"
    sleep 0.1
  done
  fail "$name: training did not reach step $steps within 60 s"
}
# finish_job SECONDS: waits at most that long for the launcher; rc is its exit (124: still running).
finish_job() {
  local until=$((SECONDS + $1))
  rc=124
  while ((SECONDS < until)); do
    if ! kill -0 "$job" 2>/dev/null; then
      rc=0
      wait "$job" || rc=$?
      return
    fi
    sleep 0.1
  done
}
# wait_until SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds or the time is up.
wait_until() {
  local until=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < until)) || return 1
    sleep 0.2
  done
}
no_rank_on() { [[ " $(running_on "$1") " != *" $rank_name "* ]]; }
nothing_on() { [[ -z $(running_on "$1") ]]; }

# Every rank has ended, on both hosts, each by itself with exit 3.
ranks_ended() {
  no_rank_on "$nsA" && no_rank_on "$nsB" && grep -qx "rank 0 exit 3" "$tmp/exits" &&
    grep -qx "rank 1 exit 3" "$tmp/exits"
}

# partition NAME TIMEOUT STOP_DAEMON: the link down mid-training, the second host's daemon stopped
# first when STOP_DAEMON is 1.
partition() {
  local name=$1 timeout_s=$2 stop_daemon=$3 t0 took daemon deadline
  echo "=== $name: the link goes down mid-training (--timeout $timeout_s$( ((stop_daemon)) && echo ", the second host's daemon stopped"))"
  : >"$tmp/exits"
  start_job "$name" 5 "$rank_wrapper" "$dptrain" --epochs 3 --timeout "$timeout_s"
  daemon=$(running_on "$nsB" orted)
  [[ -n $daemon ]] || fail "$name: no Open MPI daemon (orted) on $hostB"
  ((stop_daemon)) && kill -STOP "$daemon"
  t0=$(now_ms) deadline=$((SECONDS + timeout_s + 30))
  link down
  finish_job $((deadline - SECONDS))
  took=$(($(now_ms) - t0))
  ((rc != 124)) || fail "$name: the launcher was still running $((timeout_s + 30)) s after the link went down (--timeout $timeout_s)"
  nothing_on "$nsA" || fail "$name: left running on $hostA after the launcher returned: $(running_on "$nsA")"
  echo "  the launcher returned $((took / 1000)).$((took % 1000 / 100)) s after the link went down, exit $rc; nothing left on $hostA"
  # 3 when the launcher ended mpirun; mpirun's own status when it ended first (it can crash).
  ((rc != 0)) || fail "$name: the launcher exited 0"
  grep -q "rank(s) 1 did not answer within 2 s (stopped, dead, unreachable, or busy outside MPI; on host(s) $hostB)" "$out_file" ||
    fail "$name: no message naming rank 1 and its host $hostB"
  grep -E "error: .*did not complete within --timeout" "$out_file" | sed 's/^/  | /'
  wait_until $((deadline - SECONDS)) ranks_ended ||
    fail "$name: not every rank ended by itself with exit 3 within --timeout + 30 s (on $hostB: $(running_on "$nsB"); exits: $(tr '\n' ';' <"$tmp/exits"))"
  echo "  $(tr '\n' ';' <"$tmp/exits") on $hostB: $(running_on "$nsB")"
  # Back on the link (and awake), the daemon finds mpirun gone and ends.
  link up
  ((stop_daemon)) && kill -CONT "$daemon"
  wait_until 45 nothing_on "$nsB" || fail "$name: still on $hostB 45 s after the link came back: $(running_on "$nsB")"
  out_file=''
}

outage() {
  echo "=== outage: the link down for 4 s (--timeout 20): training recovers"
  start_job outage 5 "$dptrain" --epochs 1 --max-steps 40 --timeout 20
  link down
  sleep 4
  link up
  finish_job 120
  ((rc == 0)) || fail "outage: the launcher exited $rc, want 0"
  grep -q '"type":"epoch"' "$tmp/outage.jsonl" || fail "outage: no epoch record"
  grep -E '^epoch ' "$out_file" | sed 's/^/  | /'
  out_file=''
}

# sigterm NAME CRASH: SIGTERM to the launcher; with CRASH 1, mpirun is stopped before (so that it
# forwards nothing) and killed once the launcher has taken the signal.
sigterm() {
  local name=$1 crash=$2 names mpirun
  echo "=== $name: SIGTERM to the launcher$( ((crash)) && echo ", mpirun stopped, then killed")"
  start_job "$name" 10 "$dptrain" --epochs 2 --max-steps 150 --checkpoint-every 1 \
    --checkpoint-path "$tmp/$name.st" --timeout 60
  mpirun=$(running_on "$nsA" mpirun)
  ((crash)) && kill -STOP "$mpirun"
  kill -TERM "$job"
  if ((crash)); then
    wait_until 20 grep -q "launch/mpirun.sh: SIGTERM" "$out_file" || fail "$name: the launcher did not take SIGTERM"
    kill -KILL "$mpirun"
  fi
  finish_job 60
  names=$(running_on "$nsA") # at once: nothing may be left when the launcher has returned
  ((rc == 143)) || fail "$name: the launcher exited $rc, want 143"
  [[ " $names " != *" $rank_name "* ]] || fail "$name: a rank still runs on $hostA after the launcher returned: $names"
  if ((!crash)); then
    grep -q "SIGUSR1: checkpoint of epoch 1 step" "$out_file" || fail "$name: no stop checkpoint"
    [[ -s $tmp/$name.st ]] || fail "$name: no checkpoint file"
  fi
  wait_until 15 no_rank_on "$nsB" || fail "$name: a rank still runs on $hostB: $(running_on "$nsB")"
  echo "  exit 143; on $hostA when the launcher returned: ${names:-nothing}"
  wait_until 45 nothing_on "$nsB" || fail "$name: still on $hostB: $(running_on "$nsB")"
  out_file=''
}

cases=("${@:2}")
((${#cases[@]})) || cases=(partition stalled-daemon outage sigterm sigterm-crash)
for c in "${cases[@]}"; do
  case $c in
    partition) partition partition 8 0 ;;
    stalled-daemon) partition stalled-daemon 4 1 ;;
    outage) outage ;;
    sigterm) sigterm sigterm 0 ;;
    sigterm-crash) sigterm sigterm-crash 1 ;;
    *) fail "unknown case '$c'" ;;
  esac
done
echo "PASS: partition (faults end in bounded time on both hosts)"
