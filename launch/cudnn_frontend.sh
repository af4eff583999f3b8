#!/usr/bin/env bash
# Installs NVIDIA's header-only cudnn-frontend (the C++ face of cuDNN's graph API, used by
# src/cuda/cudnn_graph_conv.cc) into .deps/cudnn-frontend/include, before meson runs: meson only
# looks for the headers there and never downloads anything. Does nothing where the CUDA root has no
# cuDNN, or when the pinned version is already there. Without pip or a network it warns once and
# exits 0: the build then compiles without the graph path.
# Usage: bash launch/cudnn_frontend.sh   (launch/build.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
cuda=${CUDA_ROOT:-/usr/local/cuda}
dest=.deps/cudnn-frontend
stamp=$dest/VERSION

[[ -f $cuda/include/cudnn.h ]] || exit 0  # no cuDNN: no GPU backend, nothing to add
[[ -f $dest/include/cudnn_frontend.h && $(cat "$stamp" 2>/dev/null) == "$version" ]] && exit 0

warn() {
  echo "warning: cudnn-frontend $version not installed ($1); building without cuDNN's graph API" >&2
  exit 0
}
command -v python3 > /dev/null || warn "no python3"
python3 -m pip --version > /dev/null 2>&1 || warn "no pip for python3"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The headers are the same in every wheel of a version; fixed tags make the download the same
# whatever the local interpreter (the wheels also carry a Python module this build does not use).
python3 -m pip download "nvidia-cudnn-frontend==$version" --no-deps --only-binary=:all: --timeout 20 --retries 1 \
  --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
  -d "$tmp/wheel" > "$tmp/pip.log" 2>&1 || warn "pip download failed: $(tail -n 1 "$tmp/pip.log")"
# Only include/ is extracted (python's zipfile: unzip may be missing), into a staging directory
# moved into place at the end, so an interrupted run never leaves half a tree that looks installed.
python3 - "$tmp" << 'EOF' || warn "unpacking the wheel failed"
import glob, sys, zipfile
tmp = sys.argv[1]
wheels = glob.glob(tmp + "/wheel/*.whl")
if len(wheels) != 1:
    sys.exit("expected one wheel, found %d" % len(wheels))
with zipfile.ZipFile(wheels[0]) as z:
    members = [n for n in z.namelist() if n.startswith("include/")]
    if "include/cudnn_frontend.h" not in members:
        sys.exit("no include/cudnn_frontend.h in " + wheels[0])
    z.extractall(tmp + "/stage", members)
EOF
mkdir -p "$dest"
rm -rf "$dest/include"
mv "$tmp/stage/include" "$dest/include"
echo "$version" > "$stamp"
echo "cudnn-frontend $version headers installed in $dest/include" >&2
