#!/usr/bin/env bash
# Passes the tests from a fresh machine: installs what is missing, builds, runs every meson test
# suite (unit, mpi at -np 1/2/4), and prints "N passed, N failed[, N skipped]" counted per test
# case from the log. Exit code 0 only when nothing failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/deps.sh
bash launch/build.sh
build=${BUILD:-build}
rc=0
meson test -C "$build" --print-errorlogs --num-processes 1 "$@" || rc=$?
python3 tests/count_results.py "$build/meson-logs/testlog.json" || rc=$((rc ? rc : 1))
exit $rc
