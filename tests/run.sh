#!/usr/bin/env bash
# Passes the tests from a fresh machine: installs what is missing, builds, runs every meson test
# suite (unit, with the clang-format check; mpi at -np 1/2/4; cli; multihost; slurm; fuzz), then
# the unit suite again under AddressSanitizer + UndefinedBehaviorSanitizer, and prints
# "N passed, N failed, N skipped" counted per test case from the logs. Exit code 0 only when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.." || { echo "0 passed, 1 failed, 0 skipped" && exit 1; }
# One run at a time in a checkout: two at once raced over the build's meson-logs/testlog.json (each
# removes it, then counts what the other wrote) and over the build itself. The lock is the
# checkout's directory (launch/build.sh locks the build directory, taken inside this one), held by
# flock(1) with -o so that no test's process inherits it: a daemon a test leaves running would
# otherwise hold it after this run ends. DPT_TESTS_LOCKED marks the run that holds it.
if [[ ${DPT_TESTS_LOCKED:-} != "$(pwd -P)" ]]; then
  DPT_TESTS_LOCKED=$(pwd -P)
  export DPT_TESTS_LOCKED
  flock -n . true || echo "tests/run.sh: waiting for the other tests/run.sh in $DPT_TESTS_LOCKED to finish" >&2
  exec flock -o . bash tests/run.sh "$@"
fi
# The last line is the count whatever happens: a step that fails before any test runs says so, then
# "0 passed, 1 failed, 0 skipped" (it ended with the build's last error line).
give_up() {
  echo "tests/run.sh: $1: no test ran" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}
bash launch/deps.sh slurm-wlm munge iproute2 procps python3 openssh-client clang libclang-rt-14-dev clang-format python3-torchvision strace || give_up "installing the packages failed"  # procps: pgrep; openssh-client: the launcher's unreachable-host test; clang-format: the format check; python3-torchvision: cli_torchvision; strace: cli_failures' slow reader
bash launch/build.sh || give_up "the build failed"
echo "tests/run.sh: packages and build took ${SECONDS} s" >&2  # CI's budget is 30 minutes on 2 cores
build=${BUILD:-build}
asan=${BUILD_ASAN:-build-asan}
rc=0
# A log left by an earlier run must not be counted as this one's (a meson test that fails before it
# writes one: count_results.py counts the missing log as a failure).
rm -f -- "$build/meson-logs/testlog.json" "$asan/meson-logs/testlog.json"
meson test -C "$build" --print-errorlogs --num-processes 1 "$@"
status=$?
((status)) && rc=1
logs=(--status "$status" "$build/meson-logs/testlog.json")
echo "tests/run.sh: the meson suites done at ${SECONDS} s" >&2
if [[ $# -eq 0 ]]; then
  # The sanitizer build: the unit tests that do not train for long (training is covered above).
  # -Og -g1 (line tables only): the sanitizers check as much as at -O2 -g, reports still name
  # file:line, and the build takes ~2 min instead of ~7.5 on 2 cores (flags.cc alone: 24 s vs 87 s).
  # A failed sanitizer build leaves no log: counted as one failure, after the suites above.
  if { [[ -f $asan/build.ninja ]] || meson setup "$asan" -Db_sanitize=address,undefined \
      -Doptimization=g -Ddebug=false -Dcpp_args=-g1 -Dgpu=disabled >/dev/null; } &&
    ninja -C "$asan" tests/test_idx tests/test_safetensors tests/test_ops tests/test_gradcheck \
      tests/test_config >&2; then
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      meson test -C "$asan" --no-rebuild --print-errorlogs --num-processes 1 \
        idx safetensors ops gradcheck config
    status=$?
  else
    echo "tests/run.sh: the sanitizer build in $asan failed: its suite did not run" >&2
    status=1
  fi
  ((status)) && rc=1
  logs+=(--status "$status" "$asan/meson-logs/testlog.json")
fi
echo "tests/run.sh: everything done at ${SECONDS} s" >&2
python3 tests/count_results.py "${logs[@]}" || rc=1
exit $rc
