#!/usr/bin/env bash
# Configures (once) and builds dptrain into ${BUILD:-build} (a release build; the GPU backend is
# compiled when nvcc, cuDNN and NCCL are found in /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
[[ -f $build/build.ninja ]] || meson setup "$build" >&2
ninja -C "$build" >&2
