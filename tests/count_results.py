#!/usr/bin/env python3
"""Counts test cases from meson's testlog.json files: gtest cases (OK/FAILED/SKIPPED lines of rank 0)
for gtest binaries, one case per meson test otherwise. Prints 'N passed, N failed, N skipped'."""
import json
import re
import sys

passed = failed = skipped = 0
lines = []
for path in sys.argv[1:]:
    with open(path) as f:
        lines += f.readlines()
if True:
    for line in lines:
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        ok = len(re.findall(r"^\[       OK \] .* \(\d+ ms\)$", out, re.M))
        bad = len(re.findall(r"^\[  FAILED  \] .* \(\d+ ms\)$", out, re.M))
        skip = len(re.findall(r"^\[  SKIPPED \] .* \(\d+ ms\)$", out, re.M))
        if ok + bad + skip == 0:
            r = t.get("result")
            if r == "OK":
                ok = 1
            elif r == "SKIP":
                skip = 1
            else:
                bad = 1
        elif t.get("result") not in ("OK", "SKIP") and bad == 0:
            bad = 1  # the binary failed (crash, timeout, nonzero exit) after its cases passed
        passed += ok
        failed += bad
        skipped += skip
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
