#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined-behaviour sanitizers) and runs each
# for a bounded time from a seed corpus of valid files it makes (a real IDX file, gzip'd and raw,
# and a safetensors file). Any crash, sanitizer report or leak fails the run. Skips (77) where
# clang's libFuzzer runtime is missing.
# Usage: run_fuzz.sh [seconds-per-target, default 20]
set -euo pipefail
secs=${1:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work" /dev/shm/dpt_fuzz_idx_*' EXIT
cxx=$(command -v clang++ || command -v clang++-14 || true)
[[ -n $cxx ]] || { echo "skip: clang++ not installed"; exit 77; }
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$work/probe.cc"
"$cxx" -fsanitize=fuzzer "$work/probe.cc" -o "$work/probe" 2>/dev/null \
  || { echo "skip: clang's libFuzzer runtime is missing (libclang-rt-14-dev)"; exit 77; }
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src")
"$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_idx.cc" "$root/src/data/idx.cc" "$root/src/core/files.cc" \
  "$root/src/core/error.cc" -lz -o "$work/fuzz_idx"
"$cxx" "${flags[@]}" "$root/tests/fuzz/fuzz_safetensors.cc" "$root/src/train/safetensors.cc" \
  "$root/src/core/files.cc" "$root/src/core/error.cc" -o "$work/fuzz_safetensors"

# Seeds: small valid inputs, so the fuzzer starts from the interesting paths.
mkdir -p "$work/idx" "$work/st"
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
PY
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in idx st; do
  bin=$work/fuzz_idx; [[ $t == st ]] && bin=$work/fuzz_safetensors
  echo "fuzzing $(basename "$bin") for ${secs}s"
  rc=0
  "$bin" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work/$t" > "$work/log" 2>&1 || rc=$?
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|Done" "$work/log" || true
  [[ $rc -eq 0 ]] || { tail -40 "$work/log"; echo "fuzz target $(basename "$bin") failed (rc $rc)"; exit 1; }
done
echo "fuzz: no crash"
