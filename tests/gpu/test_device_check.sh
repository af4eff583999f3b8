#!/usr/bin/env bash
# tests/gpu/device_check.sh without a GPU, so that no device time is lost to the script's own bugs:
# its dry run (fake steps, a 20 s deadline) keeps the deadline, times out a hanging step, cuts what
# no longer fits, always leaves group C its share, names every step of the list once in the
# summary and packs every log; killed mid-run with its whole process group, it leaves the results
# of the steps done; without a bundle or a CUDA device it exits 77 having unpacked nothing; bad
# arguments are refused with exit 2.
set -uo pipefail
script=$(cd "$(dirname "$0")" && pwd)/device_check.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { if eval "$1"; then ok "$2"; else fail "$2"; fi; }

# The check list's steps, in order, as the script names them.
steps=(versions backend kernels ops model backend_graph graphconv graphbench bench_resnet18_graph_act16_bf16
       bench_resnet18_torch_bf16_tuned bench_resnet18_legacy_act16_bf16 bench_resnet18_legacy_bf16
       bench_resnet18_torch_bf16_eager training cli nccl reducer2 bench_resnet50_graph_act16_bf16
       bench_resnet50_torch_bf16_tuned bench_resnet18_graph_act16_plans64_bf16 profile_resnet50 profile
       fusedconv fusedbench)

# 1. The whole dry run.
t0=$SECONDS
DPT_DRY_RUN=1 OUT=$tmp/out bash "$script" > "$tmp/run.log" 2>&1
rc=$? took=$((SECONDS - t0))
sum=$tmp/out/summary.txt
check '[[ $rc -eq 0 ]]' "the dry run exits 0 (exit $rc)"
# The deadline is 20 s; a timed-out step may take timeout's 5 s kill grace on top.
check '((took <= 27))' "the dry run keeps its 20 s deadline ($took s)"
for s in "${steps[@]}"; do
  n=$(grep -cE "^[A-D] +$s +" "$sum")
  [[ $n -eq 1 ]] || fail "step $s is named $n times in the summary"
done
ok "every step of the list is named once in the summary"
check 'grep -qE "^A +ops +TIMEOUT .*rc=124" "$sum"' "a hanging step of group A is killed at its limit (rc 124)"
check 'grep -qE "^B +graphconv +TIMEOUT" "$sum"' "a hanging step of group B is killed at its limit"
check 'grep -qE "^C +bench_resnet18_graph_act16_bf16 +ok" "$sum"' "group C runs after A and B overran (its share is kept)"
check 'grep -qE "^D +[a-z0-9_]+ +CUT " "$sum"' "steps that no longer fit are cut, and the summary says so"
check 'grep -q "^done: " "$sum"' "the summary ends with the time used"
check '[[ -s $tmp/out/gpu_table.md ]]' "the table is written"
tar -tzf "$tmp/out/logs.tar.gz" > "$tmp/list" 2> /dev/null || : > "$tmp/list"
for s in versions ops graphconv bench_resnet18_graph_act16_bf16 summary.txt; do
  grep -qx "./$s.log\|./$s" "$tmp/list" || fail "logs.tar.gz lacks $s"
done
ok "logs.tar.gz holds the steps' logs and the summary"
# Every step that ran is in the summary with what its log ended with; a fake step prints its name.
check 'grep -q "fake backend" "$tmp/run.log"' "each step's log tail is on stdout"

# 2. Killed at the call's limit, with its whole process group (as the device tool kills a call):
# the steps done so far are in summary.txt and in logs.tar.gz. The kill comes once the third
# step is in the summary, whatever the machine's load: the archive packed after the second step
# was complete before the third began.
DPT_DRY_RUN=1 OUT=$tmp/killed setsid bash "$script" > "$tmp/killed.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -qE "^A +kernels " "$tmp/killed/summary.txt" 2> /dev/null && break
  sleep 0.1
done
kill -KILL -- -"$pid" 2> /dev/null
wait "$pid" 2> /dev/null
check 'grep -qE "^A +versions +ok" "$tmp/killed/summary.txt"' "killed mid-run: the finished steps are in the summary"
check 'tar -tzf "$tmp/killed/logs.tar.gz" 2>/dev/null | grep -qx "./backend.log" &&
  tar -xzOf "$tmp/killed/logs.tar.gz" ./summary.txt 2>/dev/null | grep -qE "^A +backend +ok"' \
  "killed mid-run: logs.tar.gz is whole and holds the finished steps' logs and summary"
check '! grep -q "^done: " "$tmp/killed/summary.txt"' "killed mid-run: the summary does not claim to be done"

# 3. No bundle: exit 77, nothing unpacked, the summary says why.
OUT=$tmp/nobundle DPT_BUNDLE=$tmp/none bash "$script" > "$tmp/nobundle.log" 2>&1
rc=$?
check '[[ $rc -eq 77 ]] && grep -q "no bundle at $tmp/none" "$tmp/nobundle/summary.txt"' "without a bundle: exit 77 ($rc), saying so"

# 4. A bundle but no CUDA device (where this machine has none): exit 77 before unpacking. The
# archive here would put a file under $tmp/unpacked if it were unpacked.
if [[ ! -e /dev/nvidia0 ]] && ! nvidia-smi -L > /dev/null 2>&1; then
  mkdir -p "$tmp/bundle" "$tmp/src$tmp/unpacked"
  echo x > "$tmp/src$tmp/unpacked/file"
  tar -C "$tmp/src" -cJf "$tmp/bundle/runtime.tar.xz" . 2> /dev/null || tar -C "$tmp/src" -cf "$tmp/bundle/runtime.tar.xz" .
  OUT=$tmp/nogpu DPT_BUNDLE=$tmp/bundle bash "$script" > "$tmp/nogpu.log" 2>&1
  rc=$?
  check '[[ $rc -eq 77 ]] && grep -q "no CUDA device" "$tmp/nogpu/summary.txt"' "without a GPU: exit 77 ($rc), saying so"
  check '[[ ! -e $tmp/unpacked/file ]]' "without a GPU: the bundle is not unpacked"
fi

# 5. Bad arguments.
OUT=$tmp/bad bash "$script" everything > "$tmp/bad.log" 2>&1
rc=$?
check '[[ $rc -eq 2 ]] && grep -q "unknown list .everything." "$tmp/bad.log"' "an unknown list is refused (exit $rc)"
OUT=$tmp/bad DPT_DEADLINE=soon bash "$script" > "$tmp/bad.log" 2>&1
rc=$?
check '[[ $rc -eq 2 ]] && grep -q "DPT_DEADLINE=soon" "$tmp/bad.log"' "a bad deadline is refused (exit $rc)"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
