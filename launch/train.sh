#!/usr/bin/env bash
# The main job from a fresh machine: install what is missing, build, and train LeNet on
# Fashion-MNIST with 2 ranks (one per GPU, or per CPU core where there is no GPU).
# Usage: launch/train.sh [dptrain flags...]   (default: --model lenet --epochs 10)
# The job runs in the caller's directory, so that relative paths (--data mine, --save m.st) mean
# what they mean to the caller (it ran in the repository, and read and wrote there); BUILD is
# relative to the repository, as in launch/build.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# NP is checked here, before packages and the build, and named: mpirun.sh would refuse it as
# "-np 'abc'", a flag the operator never gave.
np=${NP:-2}
[[ $np =~ ^[0-9]{1,6}$ ]] && ((10#$np >= 1)) || {
  echo "launch/train.sh: error: NP='$np': the number of ranks must be a whole number, at least 1" >&2
  exit 2
}
# The package check and the build run in the background, waited for through traps. Run in the
# foreground, a SIGINT sent to this script alone (kill -INT; a terminal's Ctrl-C reaches the whole
# job) was held by bash until the build had ended, then dropped, and the job started; a SIGTERM or
# SIGHUP ended this script (exit 143, 129) while ninja built on, orphaned. Now the signal goes on to
# the step and everything it started, the job is not started, and the exit is 128 + the signal.
# shellcheck source=launch/wait_status.sh
source "$repo/launch/wait_status.sh"
got=0 step="" step_pid=""
on_signal() {
  got=$2
  echo "launch/train.sh: $1 during $step: stopping it; the job is not started" >&2
  [[ -z $step_pid ]] || signal_tree "${1#SIG}" "$step_pid"
}
trap 'on_signal SIGHUP 1' HUP
trap 'on_signal SIGINT 2' INT
trap 'on_signal SIGTERM 15' TERM
# run_step WHAT COMMAND...: COMMAND in the background with SIGINT as the caller had it (bash makes
# a background command ignore it) and the caller's stdin (not /dev/null); exits as it failed, or
# with 128 + a signal that came meanwhile.
run_step() {
  step=$1
  shift
  (
    trap - INT QUIT
    exec "$@"
  ) <&0 &
  step_pid=$!
  ((got)) && signal_tree "$(kill -l "$got")" "$step_pid" # a signal between the fork and $!
  wait_status "$step_pid"
  step_pid=""
  ((got)) && exit $((128 + got))
  ((rc == 0)) || exit "$rc"
}
# The steps' stdout and stderr pass through relays (launch/wait_status.sh), as mpirun's do in
# launch/mpirun.sh: with `launch/train.sh 2>&1 | head -1` ninja died of SIGPIPE at its second line
# (meson and apt would too), the build failed, and the job never ran (exit 141). This script's own
# streams are kept on 3 and 4 and given back before mpirun.sh, which has relays of its own.
me=launch/train.sh
relays=()
exec 3>&1 4>&2
exec > >(relay stdout)
relays+=($!)
exec 2> >(relay stderr >&4)
relays+=($!)
end_relays() {
  exec 1>&3 2>&4 3>&- 4>&-
  wait_relays
}
trap 'end_relays' EXIT
run_step "the package check" bash "$repo/launch/deps.sh"
run_step "the build" bash "$repo/launch/build.sh" dptrain # the tests are built by tests/run.sh, when asked for
trap - EXIT
end_relays
trap - HUP INT TERM
((got == 0)) || exit $((128 + got)) # a signal after the build's end
build=${BUILD:-build}
[[ $build == /* ]] || build=$repo/$build
[[ $# -eq 0 ]] && set -- --model lenet --epochs 10
exec bash "$repo/launch/mpirun.sh" -np "$((10#$np))" "$build/dptrain" "$@"
