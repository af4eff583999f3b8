#!/usr/bin/env python3
"""Counts test cases from meson's testlog.json files: gtest cases (OK/FAILED/SKIPPED lines of rank 0)
for gtest binaries, one case per meson test otherwise. Prints 'N passed, N failed, N skipped'.
Usage: count_results.py [--status N] LOG [[--status N] LOG ...]: --status is the exit code of the
meson test that wrote the next LOG. Nothing is lost in silence: a LOG that is missing or cannot be
read (meson test never started), a line that is not JSON (a log cut short), and a meson test that
failed (--status not 0) with no failing test in its LOG (killed part-way: the tests it did not
reach are in no log) each count as one failure, named on stderr."""
import json
import re
import sys

passed = failed = skipped = 0


def lost(why):
    global failed
    print(f"count_results.py: {why}: counted as 1 failed", file=sys.stderr)
    failed += 1


args = sys.argv[1:]
status = 0
while args:
    if args[0] == "--status":
        status = int(args[1])
        args = args[2:]
        continue
    path, args = args[0], args[1:]
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        lost(f"{path}: cannot read the test log ({e.strerror})")
        status = 0
        continue
    failed_before = failed
    for n, line in enumerate(lines, 1):
        try:
            t = json.loads(line)
        except ValueError:
            lost(f"{path}: line {n} is not a test record (the log is cut short?)")
            continue
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
    if status != 0 and failed == failed_before:
        lost(f"{path}: meson test exited {status} but its log records no failing test (stopped part-way?)")
    status = 0
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
