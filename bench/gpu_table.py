#!/usr/bin/env python3
# bench/gpu_table.py -- the GPU comparison table of docs/PERFORMANCE.md from one device session's
# logs (tests/gpu/device_run.sh bench): dptrain's --metrics files (bench_<run>.jsonl) and
# bench/torch_ref.py's --json lines (in bench_<run>_torch*.log), all taken in the same session on
# the same GPU. Per run: epochs done, the median s/epoch of the epochs after the first (the first
# holds cuDNN's algorithm choice, warm-up and the CUDA-graph capture; PyTorch's its own warm-up),
# the final test accuracy, and the ratio against the PyTorch run of the same model and precision.
#
# Usage: python3 bench/gpu_table.py LOGDIR   (prints markdown)
import json
import os
import statistics
import sys


def epoch_records(path):
    """The epoch records of a dptrain --metrics file or of a log holding torch_ref --json lines."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "epoch_seconds" in r and r.get("type", "epoch") == "epoch":
                out.append(r)
    return out


def steady_seconds(records):
    """Median s/epoch without the first epoch (or the only one)."""
    secs = [r["epoch_seconds"] for r in records]
    return statistics.median(secs[1:] if len(secs) > 1 else secs)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gpu_table.py LOGDIR")
    logdir = sys.argv[1]
    runs = {}
    for name in sorted(os.listdir(logdir)):
        if not name.startswith("bench_"):
            continue
        run, ext = os.path.splitext(name[len("bench_"):])
        torch = "_torch" in run
        if (torch and ext != ".log") or (not torch and ext != ".jsonl"):
            continue
        recs = epoch_records(os.path.join(logdir, name))
        if recs:
            runs[run] = recs
    device = ""
    if os.path.exists(os.path.join(logdir, "device.txt")):
        device = open(os.path.join(logdir, "device.txt")).read().strip().splitlines()[0]
    print(f"Device: {device or 'unknown'}; s/epoch = median over epochs 2..N (epoch 1 is warm-up).\n")
    print("| run | epochs | s/epoch | test acc | vs PyTorch (same model, precision: fp32, tf32 or bf16) |")
    print("|---|---|---|---|---|")
    for run, recs in runs.items():
        s = steady_seconds(recs)
        acc = recs[-1].get("test_acc")
        acc_s = f"{acc:.4f}" if isinstance(acc, (int, float)) else "-"
        ratio = "-"
        if "_torch" not in run:
            model = run.split("_")[0]
            suffix = next((x for x in ("_bf16", "_tf32") if run.endswith(x)), "")
            ref = f"{model}_torch{suffix}"
            if ref in runs:
                ratio = f"{steady_seconds(runs[ref]) / s:.2f}x faster" if s > 0 else "-"
        print(f"| {run} | {len(recs)} | {s:.3f} | {acc_s} | {ratio} |")


if __name__ == "__main__":
    main()
