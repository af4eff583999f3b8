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
bash "$repo/launch/deps.sh"
bash "$repo/launch/build.sh" dptrain  # the tests are built by tests/run.sh, when asked for
build=${BUILD:-build}
[[ $build == /* ]] || build=$repo/$build
[[ $# -eq 0 ]] && set -- --model lenet --epochs 10
exec bash "$repo/launch/mpirun.sh" -np "$((10#$np))" "$build/dptrain" "$@"
