# Sourced by launch/mpirun.sh, launch/train.sh and launch/slurm/dptrain.sbatch: the exit status of a
# child started in the background by a script that traps signals, its children, a signal passed on
# to it and everything it started, and the relays that carry its output past a reader that left.
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

# relay NAME: copies its stdin to its stdout as it arrives (cat: a progress bar's carriage returns
# too); when a write fails (the reader has gone: `| head`, `| grep -m1`), it reads on to nowhere
# until the writer closes its end, so that the writer never meets the closed pipe (mpirun aborts
# the job after ten SIGPIPEs; ninja, meson and apt die of the first). The stdout relay warns once,
# on stderr if that still works ($me, the caller's, names the script). Relays ignore SIGINT and
# SIGHUP: those reach the writer through the script's traps, and its last output must still pass.
# A write that fails for another reason than EPIPE is no reader's leaving (it was said to be): a
# full file system (ENOSPC: `> log` on a full disk, /dev/full) or an I/O error (EIO). cat's own
# words for it (in the C locale) name the cause; the relay drains as well, and exits 74 (EX_IOERR)
# so that wait_relays sets output_lost and the caller's success does not hide the loss.
relay() {
  trap '' PIPE INT HUP
  local err what=standard\ output
  [[ $1 == stderr ]] && what=standard\ error
  { err=$(LC_ALL=C cat 2>&1 >&3 3>&-); } 3>&1 && exit 0
  if [[ $err == *"Broken pipe"* ]]; then
    [[ $1 == stdout ]] &&
      echo "${me:-$0}: warning: the reader of standard output has gone: the job goes on, its output discarded" >&2 2>/dev/null
    exec cat >/dev/null
  fi
  err=${err##*: } # "cat: write error: No space left on device": the cause
  [[ $err == "No space left on device" ]] && err+=": the file system it is written to is full"
  echo "${me:-$0}: error: cannot write to $what (${err:-a write error}): the job goes on, what it writes there is discarded" >&2 2>/dev/null
  cat >/dev/null
  exit 74
}
# Whether any relay whose pid is in the caller's array relays still runs.
relays_running() {
  local r
  for r in "${relays[@]}"; do kill -0 "$r" 2>/dev/null && return 0; done
  return 1
}
# After the writer: the relays end once they have passed its last output, which then comes before
# the script's last words. A process that inherited the writer's output and outlived it (an ssh to
# a host) would hold them open: at most 10 s, after which they are left to end on their own.
# output_lost becomes 1 when a relay could not write what it was given (its exit status 74).
# shellcheck disable=SC2034  # read by the sourcing script (mpirun.sh)
output_lost=0
wait_relays() {
  local k r
  for ((k = 0; k < 500; k++)); do
    relays_running || break
    sleep 0.02
  done
  if ! relays_running; then
    for r in "${relays[@]}"; do
      # shellcheck disable=SC2034  # read by the sourcing script (mpirun.sh)
      wait "$r" 2>/dev/null || { (($? == 74)) && output_lost=1; }
    done
  fi
  relays=()
}
