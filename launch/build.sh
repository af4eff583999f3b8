#!/usr/bin/env bash
# Configures (once) and builds dptrain into ${BUILD:-build} (a release build; the GPU backend is
# compiled when nvcc, cuDNN and NCCL are found in /usr/local/cuda, with cuDNN's graph API when
# launch/cudnn_frontend.sh could install its headers: the one step here that may download).
# One build at a time in a build directory: a second launch/build.sh (two launch/train.sh started
# together) waits for the first, instead of a second meson setup and ninja racing it over the same
# files. A build directory configured for another checkout (a copied or moved one) is refused: its
# build files name that checkout's paths, and its tests ran that checkout's binaries.
# Usage: launch/build.sh [ninja targets...]   (none: everything, tests included; launch/train.sh
# asks for dptrain alone, so a newcomer's first job does not wait for the test suites' build)
set -euo pipefail
cd "$(dirname "$0")/.."
me=launch/build.sh
die() {
  echo "$me: error: $*" >&2
  exit 2
}
build=${BUILD:-build}
[[ -n $build ]] || die "BUILD is set but empty: unset it (the default is build) or name a directory"
[[ -e $build && ! -d $build ]] && die "the build directory '$build' (BUILD) is not a directory: remove it or set BUILD to another path"
mkdir -p -- "$build" 2>/dev/null || die "cannot create the build directory '$build' (BUILD) in $PWD"
exec {lock}<"$build"
if ! flock -n "$lock"; then
  echo "$me: waiting for the other build in '$build' to finish" >&2
  flock "$lock"
fi
info=$build/meson-info/meson-info.json
if [[ -f $info ]]; then
  src=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' "$info") ||
    die "cannot read $info: remove '$build' (rm -rf -- '$build') and run again"
  [[ $(cd -- "$src" 2>/dev/null && pwd -P) == "$(pwd -P)" ]] ||
    die "the build directory '$build' (BUILD) was configured for the checkout at '$src', not this one ('$(pwd -P)'): building in it would use that checkout's paths; remove it (rm -rf -- '$build') or set BUILD to another directory"
fi
bash launch/cudnn_frontend.sh
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" >&2
elif [[ .deps/cudnn-frontend/VERSION -nt $build/build.ninja ]]; then
  meson setup --reconfigure "$build" >&2  # headers installed since the build was configured
fi
ninja -C "$build" "$@" >&2
