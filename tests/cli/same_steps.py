#!/usr/bin/env python3
"""same_steps.py A B: exit 0 when two --metrics files hold the same step records: the same steps,
each exactly once and in order, with the same loss, accuracy, learning rate and gradient norm
(timings aside); else 1 naming the first difference. Used by the CLI signal tests and the stress
script to check that a stopped, resumed run lost no step and repeated none."""
import json
import sys


def steps(path):
    recs = [json.loads(line) for line in open(path) if line.strip()]
    s = [r for r in recs if r.get("type") == "step"]
    nums = [r["step"] for r in s]
    if nums != sorted(set(nums)):
        sys.exit(f"{path}: steps repeated or out of order: {nums[:8]}...")
    return {r["step"]: (r["loss"], r["train_acc"], r["lr"], r["grad_norm"]) for r in s}


a, b = steps(sys.argv[1]), steps(sys.argv[2])
if a != b:
    first = next((k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)), None)
    sys.exit(f"{sys.argv[2]}: {len(b)} step records against {len(a)} in {sys.argv[1]}; first difference at step {first}")
print(f"{len(a)} step records, each once, identical")
