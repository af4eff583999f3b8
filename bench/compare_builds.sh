#!/usr/bin/env bash
# Checks that two dptrain binaries train bit for bit alike on the CPU: the same short runs of LeNet
# (1, 2 and 4 ranks, 16-bit gradient buckets, a checkpointed run resumed) and ResNet-18 (2 ranks,
# with and without --sync-bn, with gradient accumulation; both also in --precision bf16) with each binary, then compares the saved safetensors and the training checkpoints (every tensor
# byte for byte, the metadata but the configuration's JSON) and the metrics lines with their timings
# removed. For refactors that must move code, not arithmetic.
# Usage: bench/compare_builds.sh OLD_DPTRAIN NEW_DPTRAIN [WORKDIR]   (exit 0 when all are equal)
set -uo pipefail
old=$1 new=$2 work=${3:-$(mktemp -d)}
# The runs start in their own directories: a relative path (build/dptrain) is made absolute here.
for b in "$old" "$new"; do
  [[ -x $b ]] || { echo "compare_builds.sh: $b is not an executable" >&2; exit 2; }
done
old=$(realpath "$old") new=$(realpath "$new")
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
runs=(
  "1|--model lenet --epochs 2 --max-steps 20 --checkpoint-every 1"
  "2|--model lenet --epochs 2 --max-steps 20 --checkpoint-every 1 --metrics-every 5"
  "4|--model lenet --epochs 1 --max-steps 20 --accum-steps 2"
  "2|--model resnet18 --epochs 1 --max-steps 3 --batch-size 32 --eval-every 0 --checkpoint-every 1"
  "2|--model resnet18 --epochs 1 --max-steps 3 --batch-size 32 --eval-every 0 --sync-bn"
  "2|--model resnet18 --epochs 1 --max-steps 2 --batch-size 32 --eval-every 0 --accum-steps 2 --sync-bn"
  "2|--model lenet --epochs 1 --max-steps 20 --grad-dtype bf16"
  # Clipping on, at a norm never reached: the factor is exactly 1 (torch's min(1, ...), applied
  # always), so the bits are those of no clipping.
  "2|--model lenet --epochs 1 --max-steps 20 --clip-grad-norm 1000"
  # bf16 compute (and whatever --activation-dtype auto resolves to on this build and CPU).
  "2|--model lenet --epochs 1 --max-steps 20 --precision bf16"
  "2|--model resnet18 --epochs 1 --max-steps 2 --batch-size 32 --eval-every 0 --precision bf16"
  # A run of 2 epochs, then the same training resumed from its checkpoint for a third ("||": next
  # command, same directory).
  "2|--model lenet --epochs 2 --max-steps 10 --checkpoint-every 1||--model lenet --epochs 3 --max-steps 10 --checkpoint-every 1 --resume ckpt.safetensors --allow-config-change"
)
# Files equal byte for byte; safetensors: every tensor (name, type, shape, bytes) and every metadata
# value both builds write but "config" (its JSON gains the keys of a newer build's flags) and
# "history" (keys only one build writes, such as input_shape since 2026-11-24, are named, not compared).
same() {
  [[ $1 == *.safetensors ]] || { cmp -s "$1" "$2"; return; }
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    meta.pop("config", None)
    meta.pop("history", None)  # the epoch records checkpoints carry since 2026-11-22
    meta.pop("training_id", None)  # which training wrote it (since 2026-11-24): new at every start
    meta.pop("training_started", None)
    data = raw[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in head.items()}
(ma, ta), (mb, tb) = load(sys.argv[1]), load(sys.argv[2])
only = sorted(ma.keys() ^ mb.keys())
if only:
    print(f"  ({sys.argv[2].split('/')[-1]}: metadata only one build writes, not compared: {', '.join(only)})")
shared = ma.keys() & mb.keys()
bad = [k for k in sorted(shared) if ma[k] != mb[k]] + [k for k in sorted(ta.keys() | tb.keys()) if ta.get(k) != tb.get(k)]
if bad:
    print(f"  differing: {', '.join(bad[:8])}")
sys.exit(1 if bad else 0)
PY
}

fail=0
i=0
for run in "${runs[@]}"; do
  np=${run%%|*} flags=${run#*|}
  for which in old new; do
    bin=${!which}
    d=$work/$i-$which
    rm -rf "$d"; mkdir -p "$d"
    rest=$flags
    while [[ -n $rest ]]; do
      part=${rest%%||*}
      [[ $rest == *"||"* ]] && rest=${rest#*||} || rest=""
      # shellcheck disable=SC2086
      (cd "$d" && bash "$here/launch/mpirun.sh" -np "$np" "$bin" $part --threads 1 --eval-batch-size 500 \
          --save model.safetensors --metrics metrics.jsonl --checkpoint-path ckpt.safetensors --quiet \
          >>out.txt 2>&1) || { echo "run $i ($which, -np $np $part) failed: see $d/out.txt"; fail=1; }
    done
    # Timings differ run to run: drop them, keep every value computed from the data. Keys only
    # one build writes (a newer build's new metrics) are dropped too: the shared ones must match.
    python3 - "$d/metrics.jsonl" >"$d/metrics.cmp" <<'PY'
import json, sys
NEW = {"grad_norm", "grad_norm_max", "nonfinite_steps"}  # not written by builds before 2026-11-22
# Timings whose names lack "second": per-rank ones, and the achieved TFLOP/s (from images/s).
TIMED = {"slowest_rank", "compute_spread", "train_tflops"}
for line in open(sys.argv[1]):
    r = json.loads(line)
    for k in [k for k in r if "second" in k or k in NEW or k in TIMED]:
        del r[k]
    print(json.dumps(r, sort_keys=True))
PY
  done
  for f in model.safetensors ckpt.safetensors metrics.cmp; do
    a=$work/$i-old/$f b=$work/$i-new/$f
    [[ -e $a || -e $b ]] || continue
    if same "$a" "$b"; then echo "run $i (-np $np $flags): $f equal"
    else echo "run $i (-np $np $flags): $f DIFFERS"; fail=1; fi
  done
  i=$((i + 1))
done
exit $fail
