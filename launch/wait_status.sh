# Sourced by launch/mpirun.sh and launch/slurm/dptrain.sbatch: the exit status of a child started in
# the background by a script that traps signals.
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
