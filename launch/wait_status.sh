# Sourced by launch/mpirun.sh, launch/train.sh and launch/slurm/dptrain.sbatch: the exit status of a
# child started in the background by a script that traps signals, its children, and a signal passed
# on to it and everything it started.
# wait_status PID [quiet]: waits for PID to end and sets rc to its exit status. A trapped signal
# ends `wait` early with 128 + its number while PID still runs (bash runs the trap, then returns),
# so the wait is repeated until PID is gone: the status is PID's own, never the signal's. `quiet`
# drops the shell's notice of a job killed by a signal ("Killed"), for a kill the caller sent.
# `|| rc=$?` keeps a nonzero status from ending a script under `set -e`.
# shellcheck shell=bash
wait_status() {
  rc=""
  while [[ -z $rc ]]; do
    rc=0
    if [[ ${2:-} == quiet ]]; then
      { wait "$1"; } 2>/dev/null || rc=$?
    else
      wait "$1" || rc=$?
    fi
    # A child that ended but was not yet reaped (a zombie) still answers kill -0: one more wait
    # reaps it and returns its status.
    kill -0 "$1" 2>/dev/null && rc=""
  done
  return 0 # the loop's status is the failed kill -0's: under set -e the caller would end there
}

# children_of PID: sets the array children to the pids of PID's live child processes (field 4 of
# /proc/N/stat is the parent's pid; a zombie, field 3 Z or X, has ended). /proc is read directly,
# without procps (minimal systems lack it), and without a subshell per process.
children_of() {
  local f stat p
  children=()
  for f in /proc/[0-9]*/stat; do
    { read -r stat <"$f"; } 2>/dev/null || continue
    stat=${stat##*) } # the fields after the command name, which may hold spaces and parentheses
    [[ $stat == [ZX]* ]] && continue
    stat=${stat#* }
    [[ ${stat%% *} == "$1" ]] || continue
    p=${f#/proc/}
    children+=("${p%/stat}")
  done
  return 0
}

# signal_tree SIG PID: sends SIG to PID and to every live process descended from it, as a
# terminal's Ctrl-C reaches every process of its job. Signalling PID alone (a script) is not enough:
# a bash script that gets SIGINT while it waits for a command waits on and then goes on when the
# command did not die of it, and one that dies of SIGTERM leaves its command running, orphaned.
signal_tree() {
  local sig=$1 todo=("$2") tree=() p
  while ((${#todo[@]})); do
    p=${todo[-1]}
    unset 'todo[-1]'
    tree+=("$p")
    children_of "$p"
    todo+=("${children[@]}")
  done
  kill -s "$sig" "${tree[@]}" 2>/dev/null
  return 0
}
