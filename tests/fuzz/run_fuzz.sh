#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined-behaviour sanitizers) and runs each
# for a bounded time from a seed corpus of valid files it makes (a real IDX file, gzip'd and raw,
# a safetensors file, CIFAR records and .npy files). Any crash, sanitizer report or leak fails the run. Skips (77) where
# clang's libFuzzer runtime is missing.
# Usage: run_fuzz.sh [seconds-per-target, default 20] (the targets run at once)
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
flags="-std=c++20 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
flags+=" -I$root/include -I$root/src"
# The data readers share one input layer (src/data/dataset.cc, which also dispatches the synthetic
# source): both data targets link them all. Each source is compiled once, two at a time (ninja),
# which takes a third of the time that three serial clang lines took.
data=(data/idx data/cifar data/npy data/dataset data/synthetic core/files core/error core/text)
{
  echo "rule cxx"
  echo "  command = $cxx $flags -c \$in -o \$out"
  echo "rule link"
  echo "  command = $cxx $flags \$in -lz -o \$out"
  for s in "${data[@]}" train/safetensors; do echo "build ${s//\//_}.o: cxx $root/src/$s.cc"; done
  for t in idx data safetensors; do echo "build fuzz_$t.o: cxx $root/tests/fuzz/fuzz_$t.cc"; done
  objs=("${data[@]//\//_}")
  echo "build fuzz_idx: link fuzz_idx.o ${objs[*]/%/.o}"
  echo "build fuzz_data: link fuzz_data.o ${objs[*]/%/.o}"
  echo "build fuzz_safetensors: link fuzz_safetensors.o train_safetensors.o core_files.o core_error.o"
} > "$work/build.ninja"
ninja -C "$work" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }

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
declare -A pids
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The three targets fuzz at once (the machine's cores shared among them), each for `secs`.
for t in idx st data; do
  case $t in idx) bin=$work/fuzz_idx ;; st) bin=$work/fuzz_safetensors ;; data) bin=$work/fuzz_data ;; esac
  "$bin" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work/$t" > "$work/$t.log" 2>&1 &
  pids[$t]=$!
done
failed=0
for t in idx st data; do
  rc=0
  wait "${pids[$t]}" || rc=$?
  echo "fuzzed $t for ${secs}s:"
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|Done" "$work/$t.log" || true
  [[ $rc -eq 0 ]] || { tail -40 "$work/$t.log"; echo "fuzz target $t failed (rc $rc)"; failed=1; }
done
[[ $failed -eq 0 ]] || exit 1
echo "fuzz: no crash"
