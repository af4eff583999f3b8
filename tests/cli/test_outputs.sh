#!/usr/bin/env bash
# What a user watches: under mpirun -np 2 with small buckets, --metrics (+ --metrics-every) holds
# the documented schema, --report is an SVG with axes, a legend and three curves, --trace is valid
# Chrome-trace JSON whose all-reduce spans overlap backward spans of the same rank, and on a
# terminal rank 0 draws a progress bar. --version names the build (dptrain's version and git
# revision, oneDNN, MPI) with values read here from their own sources, once for the whole job.
# Usage: test_outputs.sh path/to/dptrain
set -uo pipefail
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
mpi=(mpirun -np 2 --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
run=(--model lenet --epochs 2 --max-steps 20 --batch-size 64 --eval-batch-size 2000 --bucket-mb 0.05)
timeout -k 5 300 "${mpi[@]}" "$bin" "${run[@]}" --metrics "$tmp/m.jsonl" --metrics-every 5 \
  --report "$tmp/curves.svg" --trace "$tmp/trace.json" --trace-steps 2:12 > "$tmp/out" 2>&1 \
  || { echo "FAIL: run failed"; tail "$tmp/out"; exit 1; }
python3 - "$tmp" <<'PY' || exit 1
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
fails = []
def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond: fails.append(what)

recs = [json.loads(l) for l in open(f"{d}/m.jsonl")]
epochs = [r for r in recs if r["type"] == "epoch"]
steps = [r for r in recs if r["type"] == "step"]
need = {"epoch": int, "train_loss": float, "train_acc": float, "test_acc": float, "test_count": int,
        "epoch_seconds": float, "images_per_second": float, "world_size": int}
check(len(epochs) == 2, "two epoch records")
check(all(isinstance(r.get(k), t) for r in epochs for k, t in need.items()), "epoch records have the schema")
check(all(r["test_count"] == 10000 and r["world_size"] == 2 for r in epochs), "test_count 10000, world_size 2")
check([r["step"] for r in steps] == [5, 10, 15, 20, 25, 30, 35, 40], "a step record every 5 steps")
check(all(isinstance(r.get(k), float) for r in steps for k in ("loss", "lr", "images_per_second", "exposed_comm_seconds")),
      "step records have loss, lr, img/s, exposed all-reduce time")

svg = ET.parse(f"{d}/curves.svg").getroot()
ns = "{http://www.w3.org/2000/svg}"
curves = [p for p in svg.iter(ns + "polyline") if p.get("class") == "curve"]
names = sorted(p.get("data-name") for p in curves)
check(names == ["test acc", "train acc", "train loss"], f"three curves: {names}")
check(all(len(p.get("points").split()) == 2 for p in curves), "each curve has a point per epoch")
texts = [t.text for t in svg.iter(ns + "text")]
check({"epoch", "train loss", "accuracy"} <= set(texts), "axis labels")
check(sum(1 for t in svg.iter(ns + "text") if t.get("class") == "legend") == 3, "a legend of three")
check(len(list(svg.iter(ns + "line"))) >= 8, "tick marks")

ev = json.load(open(f"{d}/trace.json"))["traceEvents"]
spans = [e for e in ev if e.get("ph") == "X"]
check({e["pid"] for e in spans} == {0, 1}, "one process per rank")
for pid in (0, 1):
    ar = [e for e in spans if e["pid"] == pid and e["cat"] == "comm" and "allreduce" in e["name"]]
    bw = [e for e in spans if e["pid"] == pid and e["cat"] == "backward" and e["name"] != "backward"]
    over = [a for a in ar if any(a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"] for b in bw)]
    check(len(ar) > 0 and len(bw) > 0, f"rank {pid}: all-reduce and per-layer backward spans")
    check(len(over) > 0, f"rank {pid}: {len(over)} of {len(ar)} all-reduces overlap a layer's backward")
check(any(e["cat"] == "optimizer" for e in spans) and any(e["cat"] == "wait" for e in spans), "optimizer and wait spans")
sys.exit(1 if fails else 0)
PY
# A terminal: the progress bar (carriage returns, img/s, time left) on rank 0.
if command -v script >/dev/null; then
  launcher=$(cd "$(dirname "$0")/../../launch" && pwd)/mpirun.sh
  script -qec "timeout -k 5 120 bash $launcher -np 2 $bin ${run[*]} --epochs 1" /dev/null > "$tmp/tty" 2>&1
  if grep -q $'\r' "$tmp/tty" && grep -q "s left" "$tmp/tty" && grep -q "img/s" "$tmp/tty"; then
    echo "ok: progress bar on a terminal"
  else
    echo "FAIL: no progress bar on a terminal"; tail -c 500 "$tmp/tty"; exit 1
  fi
  grep -q "s left" "$tmp/out" && { echo "FAIL: progress bar written to a non-terminal"; exit 1; }
  echo "ok: plain lines when not a terminal"
fi

# Resumed runs: the report still draws the epochs before the checkpoint (the checkpoint carries
# their records), --eval-every leaves no NaN in the SVG, and --metrics holds every step and epoch
# once: the records written after the checkpoint by the interrupted run are dropped, not repeated.
short=(--model lenet --max-steps 4 --batch-size 64 --eval-every 2 --checkpoint-every 1 --metrics-every 1)
timeout -k 5 120 "$bin" "${short[@]}" --epochs 1 --checkpoint-path "$tmp/e1.st" > /dev/null 2>&1 \
  || { echo "FAIL: the epoch-1 run failed"; exit 1; }
# The "interrupted" run: three epochs recorded, its checkpoint after epoch 1 is the one resumed.
timeout -k 5 120 "$bin" "${short[@]}" --epochs 3 --checkpoint-path "$tmp/c.st" --metrics "$tmp/r.jsonl" \
  --report "$tmp/r.svg" > /dev/null 2>&1 || { echo "FAIL: the first run failed"; exit 1; }
grep -qi nan "$tmp/r.svg" && { echo "FAIL: NaN in the report of a run with --eval-every 2"; exit 1; }
# Evaluated: epoch 2 (--eval-every 2) and 3 (the last); epoch 1 has no test-acc point.
[[ $(grep -o 'data-name="test acc"[^>]*' "$tmp/r.svg" | grep -o 'points="[^"]*"' | grep -o '[0-9.]*,[0-9.]*' | wc -l) -eq 2 ]] \
  || { echo "FAIL: want two test-acc points (epochs 2 and 3)"; exit 1; }
cp "$tmp/e1.st" "$tmp/resume.st"
python3 - "$tmp/resume.st" <<'PY' || exit 1
# The epoch-1 checkpoint of a 1-epoch run: give it the 3-epoch configuration it would have had
# mid-run (same seed and data order), so the resume continues the 3-epoch training.
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; head = json.loads(raw[8:8 + n])
cfg = json.loads(head["__metadata__"]["config"]); cfg["epochs"] = 3; head["__metadata__"]["config"] = json.dumps(cfg)
h = json.dumps(head).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
timeout -k 5 120 "$bin" "${short[@]}" --epochs 3 --checkpoint-path "$tmp/c2.st" --metrics "$tmp/r.jsonl" \
  --report "$tmp/r.svg" --resume "$tmp/resume.st" > "$tmp/resumed.out" 2>&1 \
  || { echo "FAIL: the resumed run failed"; tail -3 "$tmp/resumed.out"; exit 1; }
grep -q "record(s) past the checkpoint dropped" "$tmp/resumed.out" || { echo "FAIL: no dropped-records note"; exit 1; }
python3 - "$tmp/r.jsonl" "$tmp/r.svg" <<'PY' || exit 1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in recs if r["type"] == "step"]
epochs = [r["epoch"] for r in recs if r["type"] == "epoch"]
assert steps == list(range(1, 13)), f"step records {steps}"
assert epochs == [1, 2, 3], f"epoch records {epochs}"
svg = open(sys.argv[2]).read()
assert "nan" not in svg.lower(), "NaN in the report"
import re
pts = {m.group(1): m.group(2).split() for m in re.finditer(r'data-name="([^"]+)"[^>]*points="([^"]*)"', svg)}
assert len(pts["train loss"]) == 3, f"train loss points {pts['train loss']} (the epoch before the resume is missing)"
# Evaluated: epoch 1 (the last of the 1-epoch run the checkpoint comes from), 2 and 3 (the last).
assert len(pts["test acc"]) == 3, f"test acc points {pts['test acc']}"
print("ok: resumed metrics have every record once; the report draws every epoch and no NaN")
PY

# A --metrics record cut short (the disk filled mid-write, or the run was killed) ended the file
# without its newline; a resumed run appended its first record to that line, and both were lost
# to every JSON reader. The cut record is dropped with a warning; the next record has its own line.
cut=(--model lenet --epochs 1 --max-steps 10 --batch-size 32 --data synthetic:28x28x1:512:10 --eval-every 0
     --threads 1 --progress off --checkpoint-every 5steps --keep-checkpoints 3
     --checkpoint-path "$tmp/cut.st" --metrics "$tmp/cut.jsonl" --metrics-every 1)
timeout -k 5 120 "$bin" "${cut[@]}" > "$tmp/cut.out" 2>&1 || { echo "FAIL: the cut-record run failed"; exit 1; }
# Steps 1-3 whole, step 4 cut in the middle, as a failed write leaves it.
python3 -c 'import sys; t = open(sys.argv[1]).read().split("\n")
open(sys.argv[1], "w").write("\n".join(t[:3]) + "\n" + t[3][:40])' "$tmp/cut.jsonl"
timeout -k 5 120 "$bin" "${cut[@]}" --resume "$tmp/cut.step5.st" > "$tmp/cut.out" 2>&1 \
  || { echo "FAIL: the resume after a cut record failed"; tail -3 "$tmp/cut.out"; exit 1; }
grep -qF -- "--metrics: $tmp/cut.jsonl ended in a record cut short" "$tmp/cut.out" \
  || { echo "FAIL: no warning about the cut record"; tail -3 "$tmp/cut.out"; exit 1; }
python3 - "$tmp/cut.jsonl" <<'PY' || exit 1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]  # every line a record
steps = [r["step"] for r in recs if r["type"] == "step"]
assert steps == [1, 2, 3, 6, 7, 8, 9, 10], f"step records {steps}"
print("ok: a record cut short is dropped on resume; the records after it have lines of their own")
PY

# A --trace-steps window past the run's last step traced nothing, yet the run said "trace of steps
# 100:200 written": it warns, naming the window, the run's steps and what was traced.
five=(--model lenet --epochs 1 --max-steps 5 --batch-size 32 --data synthetic:28x28x1:512:10 --eval-every 0
      --threads 1 --progress off)
for spec in "100:200|no step was traced, $tmp/t.json has no spans" "3:200|only steps 3:5 were traced" "1:3|"; do
  window=${spec%%|*} want=${spec#*|}
  timeout -k 5 120 "$bin" "${five[@]}" --trace "$tmp/t.json" --trace-steps "$window" > "$tmp/t.out" 2>&1 \
    || { echo "FAIL: --trace-steps $window: exit $?"; tail -3 "$tmp/t.out"; exit 1; }
  if [[ -n $want ]]; then
    grep -qF -- "--trace-steps $window: this run's global steps were 0:5 (the trace starts at step ${window%%:*} itself): $want" "$tmp/t.out" \
      || { echo "FAIL: --trace-steps $window on a 5-step run: no warning '$want'"; cat "$tmp/t.out"; exit 1; }
  elif grep -qF -- "--trace-steps" "$tmp/t.out"; then
    echo "FAIL: --trace-steps $window inside the run warned: $(grep -F -- --trace-steps "$tmp/t.out")"; exit 1
  fi
  echo "ok: --trace-steps $window on a 5-step run: ${want:-no warning}"
done

# --version: one report for the job (the launcher's rank 0 prints it), exit 0, each value as its own
# source gives it: meson.build's version, the source tree's git revision, oneDNN's header, ompi_info.
src=$(cd "$(dirname "$0")/../.." && pwd)
timeout -k 5 60 "${mpi[@]}" "$bin" --version > "$tmp/v.out" 2> "$tmp/v.err" \
  || { echo "FAIL: --version exit $?"; cat "$tmp/v.out" "$tmp/v.err"; exit 1; }
version=$(sed -n "s/^ *version: '\([^']*\)',$/\1/p" "$src/meson.build")
rev=unknown
command -v git > /dev/null && rev=$(git -C "$src" rev-parse --short HEAD 2> /dev/null || echo unknown)
dnnl=$(awk '/define DNNL_VERSION_(MAJOR|MINOR|PATCH)/ {v = v (v ? "." : "") $3} END {print v}' \
  /usr/include/oneapi/dnnl/dnnl_version.h)
ompi=$(ompi_info --parsable | sed -n 's/^ompi:version:full://p')
[[ $(grep -c '^dptrain ' "$tmp/v.out") == 1 && $(wc -l < "$tmp/v.out") == 5 ]] \
  || { echo "FAIL: --version under -np 2 is not one 5-line report"; cat "$tmp/v.out"; exit 1; }
grep -qE "^dptrain $version \(git $rev[0-9a-f]*(-dirty)?\)$" "$tmp/v.out" \
  || { echo "FAIL: --version's first line is not 'dptrain $version (git $rev...)'"; cat "$tmp/v.out"; exit 1; }
grep -qF "CPU backend: oneDNN $dnnl (" "$tmp/v.out" && grep -qF "MPI: Open MPI v$ompi," "$tmp/v.out" \
  && grep -qE '^GPU backend: ' "$tmp/v.out" && grep -qE '^compiler: (g|clang)\+\+ ' "$tmp/v.out" \
  || { echo "FAIL: --version does not name oneDNN $dnnl, Open MPI $ompi, the compiler and the GPU backend"
       cat "$tmp/v.out"; exit 1; }
echo "ok: --version: dptrain $version (git $rev), oneDNN $dnnl, Open MPI $ompi, one report for 2 ranks"
# Without MPI: --version answers where MPI cannot start (here a TMPDIR under a file, where a
# singleton cannot make its session directory: any other command is exit 2), the same report.
: > "$tmp/afile"
TMPDIR=$tmp/afile/dir timeout -k 5 60 "$bin" --epochs 1 > "$tmp/v2.out" 2>&1
[[ $? == 2 ]] || { echo "FAIL: a singleton with TMPDIR under a file did not stop with exit 2"; cat "$tmp/v2.out"; exit 1; }
TMPDIR=$tmp/afile/dir timeout -k 5 60 "$bin" --version > "$tmp/v1.out" 2>&1 \
  || { echo "FAIL: --version with TMPDIR under a file: exit $?"; cat "$tmp/v1.out"; exit 1; }
cmp -s "$tmp/v.out" "$tmp/v1.out" || { echo "FAIL: --version without MPI differs"; diff "$tmp/v.out" "$tmp/v1.out"; exit 1; }
echo "ok: --version without MPI (where a singleton cannot start): the same report"
# A DPT_ISA that names no level (the report asks the CPU loops for theirs) ended --version in
# std::terminate: "terminate called after throwing", exit 134. Exit 2 naming the variable.
DPT_ISA=avx-512 timeout -k 5 60 "$bin" --version > "$tmp/v3.out" 2>&1
rc=$?
[[ $rc == 2 ]] && grep -qF "dptrain: error: DPT_ISA=avx-512: expected avx512, avx2 or generic" "$tmp/v3.out" \
  && ! grep -q terminate "$tmp/v3.out" \
  || { echo "FAIL: --version with DPT_ISA=avx-512: exit $rc (want 2 naming it)"; cat "$tmp/v3.out"; exit 1; }
echo "ok: --version with DPT_ISA=avx-512: exit 2, $(cat "$tmp/v3.out")"
# A report that cannot be written (standard output on a full disk, here /dev/full) said nothing and
# exited 0, leaving an empty file for the bug report; --help alike. Exit 2 naming standard output.
# A reader that leaves early (| head -c 1) is no failure: exit 0, nothing on stderr.
for flag in --version --help; do
  timeout -k 5 60 "$bin" $flag > /dev/full 2> "$tmp/full.err"
  rc=$?
  [[ $rc == 2 ]] && grep -qF "dptrain: error: $flag: cannot write to standard output: No space left on device" \
    "$tmp/full.err" || { echo "FAIL: $flag > /dev/full: exit $rc (want 2 naming it)"; cat "$tmp/full.err"; exit 1; }
  timeout -k 5 60 "$bin" $flag 2> "$tmp/pipe.err" | head -c 1 > /dev/null
  rc=${PIPESTATUS[0]}
  [[ $rc == 0 && ! -s $tmp/pipe.err ]] || { echo "FAIL: $flag | head -c 1: exit $rc"; cat "$tmp/pipe.err"; exit 1; }
  echo "ok: $flag > /dev/full: exit 2, $(head -c 100 "$tmp/full.err"); | head -c 1: exit 0"
done
# A resume's --metrics far larger than a run's records (a sparse file, another program's file) was
# read whole to be trimmed: a minute, then std::bad_alloc (exit 3) or the OOM killer. Refused before
# it is read when the memory cannot hold it, naming it and both sizes (DPT_MEMORY_AVAILABLE stands
# in for a small host); the file is left as it was.
big=(--data synthetic:28x28x1:256:10 --epochs 1 --max-steps 2 --eval-every 0 --checkpoint-every 1
     --checkpoint-path "$tmp/big.st" --metrics "$tmp/big.jsonl")
timeout -k 5 60 "$bin" "${big[@]}" > "$tmp/big.out" 2>&1 || { echo "FAIL: the run to resume"; cat "$tmp/big.out"; exit 1; }
truncate -s 1G "$tmp/big.jsonl"
DPT_MEMORY_AVAILABLE=512M timeout -k 5 60 "$bin" "${big[@]}" --resume "$tmp/big.st" > "$tmp/big.out" 2>&1
rc=$?
[[ $rc == 2 ]] && grep -qF -- "--metrics $tmp/big.jsonl is 1.00 GiB: trimming it" "$tmp/big.out" \
  && grep -qF "0.50 GiB is available (DPT_MEMORY_AVAILABLE)" "$tmp/big.out" && [[ $(stat -c %s "$tmp/big.jsonl") == 1073741824 ]] \
  || { echo "FAIL: a resume's 1 GiB --metrics with 512 MiB available: exit $rc (want 2 naming it)"; cat "$tmp/big.out"; exit 1; }
echo "ok: a resume's 1 GiB --metrics with 512 MiB available: exit 2, $(grep -m1 -o "error: .*" "$tmp/big.out" | cut -c1-100)"
# A --metrics removed while the run appends to it (its directory removed by a clean-up that ran too
# early) took every later record into a file no name reaches, without a word: exit 0, no file, no
# warning (a --report there warned). Said once, and again at the end, naming the file; the run goes
# on. Moved away with another file put at its name (a log rotation), alike, and the records go on
# into the file moved away, which ends with the last epoch's (the new file put there atomically: a
# record between a mv and a new file would see it removed). The run is slowed so that it outlives
# the rm.
for how in removed replaced; do
  mkdir -p "$tmp/gone"
  DPT_FAULT_SLOW_RANK=0:4 timeout -k 5 120 "$bin" --data synthetic:28x28x1:512:10 --batch-size 64 --epochs 6 \
    --eval-every 0 --metrics "$tmp/gone/m.jsonl" > "$tmp/gone.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -s $tmp/gone/m.jsonl ]] && break; sleep 0.05; done
  if [[ $how == removed ]]; then
    rm -rf "$tmp/gone"
  else
    ln "$tmp/gone/m.jsonl" "$tmp/gone/old.jsonl" && : > "$tmp/gone/new" && mv -f "$tmp/gone/new" "$tmp/gone/m.jsonl"
  fi
  wait $pid
  rc=$?
  [[ $rc == 0 ]] && grep -qF -- "--metrics: $tmp/gone/m.jsonl was $how while the run appended to it" "$tmp/gone.out" \
    && grep -qF "these outputs were not (all) written: --metrics" "$tmp/gone.out" \
    && { [[ $how == removed ]] || tail -n 1 "$tmp/gone/old.jsonl" | grep -qF '"epoch":6,'; } \
    || { echo "FAIL: --metrics $how mid-run: exit $rc, no warning naming it, or the moved file lacks epoch 6"; tail -5 "$tmp/gone.out"; exit 1; }
  echo "ok: --metrics $how mid-run: exit 0, $(grep -m1 -o "warning: --metrics: .*" "$tmp/gone.out" | cut -c1-140)"
  rm -rf "$tmp/gone"
done
