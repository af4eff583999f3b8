#!/usr/bin/env bash
# Configures (once) and builds dptrain into ${BUILD:-build} (a release build; the GPU backend is
# compiled when nvcc, cuDNN and NCCL are found in /usr/local/cuda, with cuDNN's graph API when
# launch/cudnn_frontend.sh could install its headers: the one step here that may download).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
bash launch/cudnn_frontend.sh
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" >&2
elif [[ .deps/cudnn-frontend/VERSION -nt $build/build.ninja ]]; then
  meson setup --reconfigure "$build" >&2  # headers installed since the build was configured
fi
ninja -C "$build" >&2
