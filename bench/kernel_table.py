#!/usr/bin/env python3
# bench/kernel_table.py -- where a GPU step's time goes, from Nsight Compute's CSV: every kernel
# that ran inside dptrain's profiler window (DPT_PROFILE_STEPS=A:B with
# `ncu --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum --csv
# --print-units base ... > FILE`; the program's own lines in FILE are skipped: only lines that
# start with a quote are CSV; tests/gpu/device_check.sh's profile step), grouped by kernel
# name and by kind (cuDNN/cuBLAS convolution and GEMM engines against dptrain's own kernels), as
# markdown. Times are each kernel's own duration as ncu measured it (one at a time, caches flushed
# between kernels by default), so their sum is an upper bound on the step's GPU time, not the
# wall-clock step.
#
# Usage: python3 bench/kernel_table.py NCU.csv STEPS [TOP]   (STEPS: the window's step count)
import csv
import re
import sys
from collections import defaultdict

UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}
# Library engines by their kernel names (cuDNN's xmma/cutlass/implicit-GEMM families, cuBLAS's
# gemm kernels); everything else is dptrain's own (kernels/*.cu) or the runtime's.
LIBRARY = re.compile(r"xmma|cudnn|cutlass|implicit_convolve|conv2d|dgrad|wgrad|fprop|gemm|sm[0-9]+_|nchw|nhwc|winograd",
                     re.I)
KINDS = [("batchnorm", re.compile(r"bn_|batchnorm|channel_sum|genstats|norm", re.I)),
         ("relu / add / pool", re.compile(r"relu|add|pool|residual", re.I)),
         ("optimizer / loss / data", re.compile(r"sgd|momentum|optim|loss|softmax|gather|image|augment|label", re.I)),
         ("conversion / copies", re.compile(r"convert|bf16|to_bf16|widen|filter_move|copy|memcpy|cast", re.I))]


def kind_of(name):
    if LIBRARY.search(name):
        return "cuDNN / cuBLAS"
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def read(path):
    """(kernel name, seconds) of every gpu__time_duration row of an ncu --csv log."""
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        rows.append((r.get("Kernel Name", "?"), value * UNITS.get(r.get("Metric Unit", "nsecond"), 1e-9)))
    return rows


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: kernel_table.py NCU.csv STEPS [TOP]")
    rows = read(sys.argv[1])
    steps = max(1, int(sys.argv[2]))
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    if not rows:
        raise SystemExit(f"{sys.argv[1]}: no gpu__time_duration.sum rows (did ncu profile anything?)")
    total = sum(s for _, s in rows)
    by_name, by_kind = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    for name, s in rows:
        for table, key in ((by_name, name), (by_kind, kind_of(name))):
            table[key][0] += 1
            table[key][1] += s
    print(f"{len(rows)} kernels in {steps} step(s): {1e3 * total / steps:.3f} ms of kernel time per step\n")
    print("| kind | kernels per step | ms per step | share |\n|---|---|---|---|")
    for kind, (n, s) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {n / steps:.0f} | {1e3 * s / steps:.3f} | {100 * s / total:.1f} % |")
    print(f"\n| kernel (top {top} by time) | kind | launches per step | ms per step | mean us | share |")
    print("|---|---|---|---|---|---|")
    for name, (n, s) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"| `{short}` | {kind_of(name)} | {n / steps:.0f} | {1e3 * s / steps:.3f} | {1e6 * s / n:.1f} "
              f"| {100 * s / total:.1f} % |")


if __name__ == "__main__":
    main()
