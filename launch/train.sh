#!/usr/bin/env bash
# The main job from a fresh machine: install what is missing, build, and train LeNet on
# Fashion-MNIST with 2 ranks (one per GPU, or per CPU core where there is no GPU).
# Usage: launch/train.sh [dptrain flags...]   (default: --model lenet --epochs 10)
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/deps.sh
bash launch/build.sh
[[ $# -eq 0 ]] && set -- --model lenet --epochs 10
exec bash launch/mpirun.sh -np "${NP:-2}" "${BUILD:-build}/dptrain" "$@"
