#!/usr/bin/env python3
"""Scaling forecast for data-parallel training with an alpha-beta model of ring all-reduce.

  T_allreduce(n, p) = 2 (p - 1) alpha + 2 (p - 1) / p * n / B       (ring, bus bandwidth B)
  exposed(p)        = max(0, T_allreduce - overlap * T_backward)      (bucketed overlap)
  efficiency(p)     = T_compute / (T_compute + exposed(p))            (per-GPU batch fixed)

Inputs are measured figures (compute per step, gradient bytes) and published link figures; the
table prints the efficiency for 1..64 GPUs and the bucket size that keeps the per-bucket latency
term under 10 % of the bucket's transfer time (alpha * B / 0.1 bytes, rounded to MiB).
Usage: bench/forecast.py [--json] [--link NAME ALPHA BW ...]
  --link adds a measured link (ALPHA: seconds per hop, BW: bus bandwidth in bytes/s), e.g. the
  fits bench/thinlink.sh prints for its tc-shaped links; given one or more, only those are used.
"""
import json
import sys

MB = 1024 * 1024
# Links: (name, bus bandwidth B in bytes/s, per-hop latency alpha in s, GPUs per node on it).
LINKS = [
    ("NVLink (8xH100, NCCL busbw 370-480 GB/s)", 400e9, 8e-6),
    ("400 Gb/s network (50 GB/s)", 50e9, 15e-6),
    ("100 Gb/s network (12.5 GB/s)", 12.5e9, 20e-6),
]
# Workloads: (name, gradient bytes, compute s/step, backward share of compute). Compute per step:
# measured on one H100 (docs/PERFORMANCE.md "GPU", 2026-11-22, d2l recipe, batch 256, 234 steps per
# epoch): LeNet --tf32 0.128 s/epoch, ResNet-18 --precision bf16 2.397 s/epoch; CPU: measured here.
WORKLOADS = [
    ("LeNet, H100 --tf32 (measured 0.55 ms/step)", 129068 * 4, 0.128 / 234, 0.6),
    ("ResNet-18 fp32 grads, H100 bf16 (measured 10.2 ms/step)", 11175818 * 4, 2.397 / 234, 0.65),
    ("ResNet-18 bf16 grads, H100 bf16 (measured 10.2 ms/step)", 11175818 * 2, 2.397 / 234, 0.65),
    # bench.py step, 2026-11-21 12:28 UTC: forward + backward + data + optimizer on rank 0.
    ("LeNet, CPU core (measured 32.0 ms/step at 128/rank)", 129068 * 4, 0.0320, 0.70),
    ("ResNet-18, CPU core (measured 1.65 s/step at 64/rank)", 11175818 * 4, 1.649, 0.66),
]
P = [1, 2, 4, 8, 16, 32, 64]


def t_allreduce(n, p, alpha, bw):
    return 0.0 if p == 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw


def links_from_argv(argv):
    """The --link NAME ALPHA BW triples of the command line, or the published LINKS."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--link":
            if i + 3 >= len(argv):
                sys.exit("forecast.py: --link needs NAME ALPHA BW")
            out.append((argv[i + 1], float(argv[i + 3]), float(argv[i + 2])))
            i += 4
        else:
            i += 1
    return out or LINKS


def main():
    rows = []
    links = links_from_argv(sys.argv[1:])
    for wname, n, tc, bshare in WORKLOADS:
        for lname, bw, alpha in links:
            effs = []
            for p in P:
                ar = t_allreduce(n, p, alpha, bw)
                exposed = max(0.0, ar - 0.8 * bshare * tc)  # 80 % of backward usable for overlap
                effs.append(tc / (tc + exposed))
            bucket = max(1, round(alpha * bw / 0.1 / MB))
            rows.append({"workload": wname, "link": lname, "efficiency": dict(zip(P, effs)),
                         "allreduce_ms_at_64": t_allreduce(n, 64, alpha, bw) * 1e3,
                         "compute_ms": tc * 1e3, "bucket_mib": bucket})
    if "--json" in sys.argv:
        for r in rows:
            print(json.dumps(r))
        return
    print("| workload | link | compute ms/step | all-reduce ms at 64 | " + " | ".join(f"p={p}" for p in P) + " | bucket |")
    print("|---|---|---|---|" + "---|" * len(P) + "---|")
    for r in rows:
        print(f"| {r['workload']} | {r['link']} | {r['compute_ms']:.2f} | {r['allreduce_ms_at_64']:.2f} | "
              + " | ".join(f"{100 * r['efficiency'][p]:.0f} %" for p in P) + f" | {r['bucket_mib']} MiB |")


if __name__ == "__main__":
    main()
