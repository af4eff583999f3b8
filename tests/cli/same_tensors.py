#!/usr/bin/env python3
"""same_tensors.py A B: exit 0 when the two safetensors files hold the same tensors, bit for bit
(metadata aside), else 1 naming the first that differ. Used by the CLI and Slurm tests to check
that a stopped and resumed run ends where an uninterrupted one ends. With --except PREFIX, tensors
whose names start with PREFIX are left out (a fine-tuned classifier head)."""
import json
import struct
import sys


def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()}


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if len(sys.argv) == 5 and sys.argv[3] == "--except":
    a, b = ({k: v for k, v in t.items() if not k.startswith(sys.argv[4])} for t in (a, b))
bad = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print(f"{sys.argv[2]}: {len(b)} tensors", f"differ from {sys.argv[1]}: {bad[:3]}" if bad else f"identical to {sys.argv[1]}")
sys.exit(1 if bad else 0)
