#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined-behaviour sanitizers) and runs each
# for a bounded time from a seed corpus of valid files it makes (a real IDX file, gzip'd and raw,
# a safetensors file, CIFAR records and .npy files). Any crash, sanitizer report or leak fails the run. Skips (77) where
# clang's libFuzzer runtime is missing.
# Usage: run_fuzz.sh [seconds-per-target, default 20]
set -euo pipefail
secs=${1:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work" /dev/shm/dpt_fuzz_idx_* /dev/shm/dpt_fuzz_data_*' EXIT
cxx=$(command -v clang++ || command -v clang++-14 || true)
[[ -n $cxx ]] || { echo "skip: clang++ not installed"; exit 77; }
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$work/probe.cc"
"$cxx" -fsanitize=fuzzer "$work/probe.cc" -o "$work/probe" 2>/dev/null \
  || { echo "skip: clang's libFuzzer runtime is missing (libclang-rt-14-dev)"; exit 77; }
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src")
# The data readers share one input layer (src/data/dataset.cc, which also dispatches the synthetic
# source): both data targets link them all.
data_src=("$root/src/data/idx.cc" "$root/src/data/cifar.cc" "$root/src/data/npy.cc" "$root/src/data/dataset.cc"
          "$root/src/data/synthetic.cc" "$root/src/core/files.cc" "$root/src/core/error.cc")
"$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_idx.cc" "${data_src[@]}" -lz -o "$work/fuzz_idx"
"$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_data.cc" "${data_src[@]}" -lz -o "$work/fuzz_data"
"$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_safetensors.cc" "$root/src/train/safetensors.cc" \
  "$root/src/core/files.cc" "$root/src/core/error.cc" -o "$work/fuzz_safetensors"

# Seeds: small valid inputs, so the fuzzer starts from the interesting paths.
mkdir -p "$work/idx" "$work/st" "$work/data"
python3 - "$work" <<'PY'
import gzip, json, struct, sys
w = sys.argv[1]
raw = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3]) + bytes(range(18))
open(f"{w}/idx/raw", "wb").write(raw)
open(f"{w}/idx/gz", "wb").write(gzip.compress(raw))
open(f"{w}/idx/labels", "wb").write(bytes([0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 9]))
hdr = json.dumps({"__metadata__": {"model": "lenet"},
                  "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                  "n": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]}}).encode()
hdr += b" " * (-len(hdr) % 8)
open(f"{w}/st/seed", "wb").write(struct.pack("<Q", len(hdr)) + hdr + bytes(24))
# fuzz_data: first byte = use (0 CIFAR-10, 1 CIFAR-100, 2 npy images, 3 npy labels, 4 npy set, 5
# CIFAR-10 set), then the file.
def npy(descr, shape, payload, major=1):
    shape_text = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    h = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
    pre = 10 if major == 1 else 12
    h += " " * (-(pre + len(h) + 1) % 64) + "\n"
    size = struct.pack("<H" if major == 1 else "<I", len(h))
    return b"\x93NUMPY" + bytes([major, 0]) + size + h.encode() + payload
pix = bytes((i * 7) % 256 for i in range(3072))
imgs = npy("|u1", [2, 3, 3], bytes(range(18)))
lbls = npy("<i8", [2], struct.pack("<2q", 1, 0))
seeds = {"c10": b"\0" + bytes([3]) + pix, "c100": b"\1" + bytes([4, 21]) + pix,
         "img": b"\2" + imgs, "img4": b"\2" + npy("|u1", [1, 2, 2, 3], bytes(12), 2),
         "lbl": b"\3" + lbls, "lbl1": b"\3" + npy(">u2", [3], struct.pack(">3H", 0, 9, 255), 3),
         "set": b"\4" + struct.pack("<H", len(imgs)) + imgs + lbls, "c10set": b"\5" + bytes([3]) + pix}
for name, b in seeds.items():
    open(f"{w}/data/{name}", "wb").write(b)
PY
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in idx st data; do
  case $t in idx) bin=$work/fuzz_idx ;; st) bin=$work/fuzz_safetensors ;; data) bin=$work/fuzz_data ;; esac
  echo "fuzzing $(basename "$bin") for ${secs}s"
  rc=0
  "$bin" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work/$t" > "$work/log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|Done" "$work/log" || true
  [[ $rc -eq 0 ]] || { tail -40 "$work/log"; echo "fuzz target $(basename "$bin") failed (rc $rc)"; exit 1; }
done
echo "fuzz: no crash"
