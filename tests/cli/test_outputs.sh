#!/usr/bin/env bash
# What a user watches: under mpirun -np 2 with small buckets, --metrics (+ --metrics-every) holds
# the documented schema, --report is an SVG with axes, a legend and three curves, --trace is valid
# Chrome-trace JSON whose all-reduce spans overlap backward spans of the same rank, and on a
# terminal rank 0 draws a progress bar.
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
