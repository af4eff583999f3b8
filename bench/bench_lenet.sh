#!/usr/bin/env bash
# bench/bench_lenet.sh -- LeNet (d2l recipe, 1 epoch of Fashion-MNIST) speed comparison:
# dptrain (under `mpirun -np 1`) against the PyTorch reference bench/torch_ref.py, for
# 1 and 2 compute threads. Runs the two alternately, --reps times each, and prints one
# fixed-width table of median epoch seconds (training loop only), the speedup
# (pytorch_s / dptrain_s, >1 means dptrain is faster) and the spread of each side
# ((max-min)/median over the reps, in percent). --json prints the rows as JSON lines.
#
# Usage: bench/bench_lenet.sh [--reps 3] [--build build] [--threads "1 2"] [--json]
# Env:   DPTRAIN_EXTRA_ARGS  extra arguments appended to the dptrain command line.
set -euo pipefail

REPS=3
BUILD=build
THREADS="1 2"
JSON=0
PY=/usr/bin/python3   # Debian's python3 has torch; the pyenv python3 does not

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) REPS="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --json) JSON=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_lenet.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_lenet.sh: --reps must be a positive integer" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
DPTRAIN="$BUILD/dptrain"
TORCH_REF="$HERE/torch_ref.py"

if [[ ! -x "$DPTRAIN" ]]; then
  echo "bench_lenet.sh: dptrain binary not found at $DPTRAIN (build it first, or pass --build DIR)" >&2
  exit 2
fi
command -v mpirun >/dev/null || { echo "bench_lenet.sh: mpirun not found" >&2; exit 2; }
[[ -x "$PY" ]] || { echo "bench_lenet.sh: $PY not found" >&2; exit 2; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/bench_lenet.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

MPI_FLAGS=(-np 1 --bind-to none)   # default core binding would pin all threads to one core
[[ "$(id -u)" -eq 0 ]] && MPI_FLAGS+=(--allow-run-as-root)
read -r -a EXTRA <<< "${DPTRAIN_EXTRA_ARGS:-}"

# Prints the epoch_seconds of the last JSON object line in file $1.
epoch_seconds() {
  "$PY" - "$1" <<'EOF'
import json, sys
val = None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        try:
            val = json.loads(line).get("epoch_seconds", val)
        except ValueError:
            pass
if val is None:
    sys.exit("no JSON line with epoch_seconds in " + sys.argv[1])
print(f"{float(val):.6f}")
EOF
}

fail() {  # $1 = what failed, $2 = its log
  echo "bench_lenet.sh: $1 failed; last lines of its output:" >&2
  tail -n 20 "$2" >&2 || true
  exit 1
}

results="$tmp/results.tsv"   # workload threads side seconds
: > "$results"
for t in $THREADS; do
  for ((r = 1; r <= REPS; r++)); do
    # (a) dptrain
    rm -f "$tmp/m.jsonl"
    echo "# [threads $t rep $r/$REPS] dptrain ..." >&2
    OMPI_MCA_pml=ob1 mpirun "${MPI_FLAGS[@]}" "$DPTRAIN" --model lenet --recipe d2l --epochs 1 \
        --threads "$t" --metrics "$tmp/m.jsonl" ${EXTRA[@]+"${EXTRA[@]}"} > "$tmp/dptrain.log" 2>&1 \
      || fail "dptrain (threads $t)" "$tmp/dptrain.log"
    [[ -s "$tmp/m.jsonl" ]] || fail "dptrain metrics file (threads $t)" "$tmp/dptrain.log"
    s="$(epoch_seconds "$tmp/m.jsonl")" || fail "reading dptrain metrics" "$tmp/m.jsonl"
    printf 'lenet\t%s\tdptrain\t%s\n' "$t" "$s" >> "$results"
    # (b) PyTorch reference
    echo "# [threads $t rep $r/$REPS] pytorch ..." >&2
    "$PY" "$TORCH_REF" --model lenet --recipe d2l --epochs 1 --threads "$t" --json \
        > "$tmp/torch.out" 2> "$tmp/torch.err" \
      || { cat "$tmp/torch.out" >> "$tmp/torch.err"; fail "torch_ref.py (threads $t)" "$tmp/torch.err"; }
    s="$(epoch_seconds "$tmp/torch.out")" || fail "reading torch_ref.py output" "$tmp/torch.out"
    printf 'lenet\t%s\tpytorch\t%s\n' "$t" "$s" >> "$results"
  done
done

cpu_model="$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*:[[:space:]]*//' || true)"
"$PY" - "$results" "$JSON" "$REPS" "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$(nproc)" "${cpu_model:-unknown}" <<'EOF'
import json, statistics, sys
path, as_json, reps, date, ncpu, cpu = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), *sys.argv[4:7]
vals = {}
for line in open(path):
    w, t, side, s = line.rstrip("\n").split("\t")
    vals.setdefault((w, int(t)), {}).setdefault(side, []).append(float(s))

def spread(xs):
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m * 100.0 if m > 0 else 0.0

rows = []
for (w, t), d in sorted(vals.items()):
    dp, pt = d["dptrain"], d["pytorch"]
    md, mp = statistics.median(dp), statistics.median(pt)
    rows.append({"workload": w, "threads": t, "dptrain_s": md, "pytorch_s": mp,
                 "speedup": mp / md if md > 0 else None,
                 "dptrain_spread_pct": spread(dp), "pytorch_spread_pct": spread(pt),
                 "reps": reps, "dptrain_all_s": dp, "pytorch_all_s": pt,
                 "date": date, "nproc": int(ncpu), "cpu": cpu})
if as_json:
    for r in rows:
        print(json.dumps(r))
    sys.exit(0)
print(f"# date {date}")
print(f"# machine: nproc {ncpu}, cpu {cpu}")
print("# epoch_seconds = training loop of 1 epoch (234 steps x 256); speedup = pytorch_s / dptrain_s;"
      " spread = (max-min)/median")
print(f"# {'workload':<9} {'threads':>7} {'dptrain_s(median)':>18} {'pytorch_s(median)':>18} "
      f"{'speedup':>8} {'dptrain_spread':>15} {'pytorch_spread':>15} {'reps':>5}")
for r in rows:
    sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "n/a"
    print(f"  {r['workload']:<9} {r['threads']:>7} {r['dptrain_s']:>18.3f} {r['pytorch_s']:>18.3f} "
          f"{sp:>8} {r['dptrain_spread_pct']:>14.1f}% {r['pytorch_spread_pct']:>14.1f}% {r['reps']:>5}")
EOF
