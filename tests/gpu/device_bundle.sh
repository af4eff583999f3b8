#!/usr/bin/env bash
# Packs what the GPU test machine lacks into .gpu-bundle/ (git-ignored, carried by the device
# tool): that machine has CUDA, cuBLAS, cuDNN and NCCL (PyTorch's wheels) but no Open MPI, oneDNN or
# gtest, and cannot fetch them, so dptrain and the GPU tests are built here and travel with every
# library they need that is not CUDA's or glibc's, Open MPI's plugins and help files at their own
# absolute paths, and the data set. tests/gpu/device_check.sh unpacks it there.
# Usage (repository root, after `meson setup build`): bash tests/gpu/device_bundle.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
bundle=$root/.gpu-bundle
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-bundle/' "$exclude" 2>/dev/null || echo '/.gpu-bundle/' >> "$exclude"  # carried, never committed

# The graph-API convolution's suites (plain and fused) exist only in builds with cudnn-frontend's headers.
graph=()
ninja -C "$build" -t query tests/gpu/test_graph_conv > /dev/null 2>&1 &&
  graph=(tests/gpu/test_graph_conv tests/gpu/test_fused_conv)
ninja -C "$build" dptrain tests/test_backend_ops tests/gpu/test_gpu_kernels tests/gpu/test_gpu_ops \
  tests/gpu/test_gpu_nccl tests/gpu/test_gpu_model bench/gpu_conv_bench "${graph[@]}"
bins=("$build/dptrain" "$build/tests/test_backend_ops" "$build"/tests/gpu/test_gpu_{kernels,ops,nccl,model}
  "$build/bench/gpu_conv_bench" "${graph[@]/#/$build/}")

stage=$(mktemp -d)
chmod 755 "$stage"  # it becomes the archive's ./: never a 700 entry for /
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/opt/dpt/bin" "$stage/opt/dpt/lib"
cp "${bins[@]}" "$stage/opt/dpt/bin/"
# Without debug sections (symbols stay, for backtraces): the bundle must leave room in the 64 MiB
# that travels for the working tree.
command -v strip > /dev/null && strip --strip-debug "$stage"/opt/dpt/bin/*

# Open MPI (runtime, launcher, help files, plugins) and PMIx, at the paths compiled into them.
for pkg in libopenmpi3 openmpi-bin openmpi-common libpmix2; do
  dpkg -L "$pkg" | while read -r f; do
    [[ -f $f || -L $f ]] || continue
    case $f in /usr/share/doc/* | /usr/share/man/* | */include/* | *.h | *.mod) continue ;; esac
    dir=$(readlink -f "$(dirname "$f")")  # merged /usr: /lib is a link to usr/lib
    mkdir -p "$stage$dir"
    cp -a "$f" "$stage$dir/"
  done
done
ln -sf orterun "$stage/usr/bin/mpirun"

# Every other shared library the binaries and Open MPI's plugins load, except glibc's, the C++
# runtime (the GPU machine's is newer) and CUDA's (taken from that machine, matching its driver).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
{
  ldd "${bins[@]}"
  find "$stage/usr" -name '*.so*' -type f -exec ldd {} + 2>/dev/null
} | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  name=$(basename "$lib")
  [[ $name =~ $skip ]] && continue
  [[ -e $stage$lib || -e $stage/usr$lib ]] && continue  # shipped with the packages above
  cp -L "$lib" "$stage/opt/dpt/lib/$name"
done

rm -rf "$bundle"
mkdir -p "$bundle"
# -9: its 64 MiB dictionary spans the binaries, which each link the same libdpt code (19.9 MiB at
# -6 with 8 MiB, 16.6 at -9, 2026-11-27: the bundle had grown past its 48 MiB at -6).
tar -C "$stage" -cf - . | xz -T0 -9 > "$bundle/runtime.tar.xz"
if [[ -d $data ]]; then cp -r "$data" "$bundle/data"; else echo "no data set at $data: the tests use synthetic data"; fi
du -sh "$bundle" "$bundle"/*
# The device tool carries the working tree and the bundle together, 64 MiB at most: the bundle
# keeps to 48.
kib=$(du -sk "$bundle" | cut -f1)
if ((kib > 48 * 1024)); then
  echo "the bundle is $((kib / 1024)) MiB, over the 48 MiB it may take: strip more, or carry less data" >&2
  exit 1
fi
echo "carry .gpu-bundle and run: bash tests/gpu/device_check.sh   (bundle $((kib / 1024)) MiB of the 48 it may take)"
