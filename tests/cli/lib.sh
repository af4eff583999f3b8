# What the command-line test scripts share (sourced, after `set -uo pipefail`, with the dptrain
# binary as $1): bin, a temporary directory tmp removed on exit, the MPI environment, an mpirun
# command line `mpi` (add -np), the failure count, fail(), expect() and same_tensors().
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
fails=0
mpi=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE NEEDLE -- command...: the command, bounded by $EXPECT_TIMEOUT seconds (default 120),
# must exit with CODE and print NEEDLE; its output stays in $tmp/out.txt for further checks.
expect() {
  local code=$1 needle=$2
  shift 3
  local rc
  timeout -k 5 "${EXPECT_TIMEOUT:-120}" "$@" > "$tmp/out.txt" 2>&1
  rc=$?
  if [[ $rc -ne $code ]] || ! grep -qF -- "$needle" "$tmp/out.txt"; then
    fail "$* -> exit $rc (want $code), output lacks '$needle':"
    tail -5 "$tmp/out.txt"
  else
    echo "ok: exit $rc, '$needle' <- ${*: -3}"
  fi
}

# same_tensors A B [--except PREFIX]: the two safetensors files hold the same tensors, bit for bit
# (metadata aside; names starting with PREFIX left out).
lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
same_tensors() { python3 "$lib_dir/same_tensors.py" "$@"; }

# run LOG args...: a run bounded by $RUN_TIMEOUT seconds (default 180), its output in LOG.
run() {
  local log=$1; shift
  timeout -k 5 "${RUN_TIMEOUT:-180}" "$@" > "$log" 2>&1
}

# meta_of KEY FILE: the value of KEY in a safetensors file's metadata (read from its header alone;
# empty when absent).
meta_of() {
  python3 -c '
import json, struct, sys
f = open(sys.argv[2], "rb"); n = struct.unpack("<Q", f.read(8))[0]
print(json.loads(f.read(n)).get("__metadata__", {}).get(sys.argv[1], ""))' "$1" "$2"
}
