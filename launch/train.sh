#!/usr/bin/env bash
# The main job from a fresh machine: install what is missing, build, and train LeNet on
# Fashion-MNIST with 2 ranks (one per GPU, or per CPU core where there is no GPU).
# Usage: launch/train.sh [dptrain flags...]   (default: --model lenet --epochs 10)
# The job runs in the caller's directory, so that relative paths (--data mine, --save m.st) mean
# what they mean to the caller (it ran in the repository, and read and wrote there); BUILD is
# relative to the repository, as in launch/build.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/launch/deps.sh"
bash "$repo/launch/build.sh"
build=${BUILD:-build}
[[ $build == /* ]] || build=$repo/$build
[[ $# -eq 0 ]] && set -- --model lenet --epochs 10
exec bash "$repo/launch/mpirun.sh" -np "${NP:-2}" "$build/dptrain" "$@"
