#!/usr/bin/env bash
# Per-rank timings in the epoch records and the straggler warning: at world size 1 and 2 every
# epoch record carries slowest_rank, slowest/median compute seconds per step, the spread and the
# per-rank arrays, consistently; a 2-rank run whose rank 1 is really slowed (SIGSTOP/SIGCONT duty
# cycle from outside, for the whole run) names rank 1 as the slowest and warns about it after 3
# epochs in a row, and the same run without the throttle does not warn.
# Usage: test_stragglers.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
job="" throttler=""
cleanup() {
  [[ -n $throttler ]] && kill "$throttler" 2>/dev/null
  [[ -n $job ]] && kill -CONT $(pgrep -P "$job") 2>/dev/null
  [[ -n $job ]] && kill -9 "$job" $(pgrep -P "$job") 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
run=(--model lenet --epochs 5 --max-steps 40 --batch-size 64 --eval-batch-size 2000 --seed 3)

# check_records FILE WORLD: every epoch record has the per-rank fields, consistent with each other.
check_records() {
  python3 - "$1" "$2" <<'EOF' || fail "per-rank fields of $1 (world $2) are missing or inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"epoch"' in l]
world = int(sys.argv[2])
assert recs, "no epoch records"
for r in recs:
    c, w = r["rank_compute_seconds"], r["rank_wait_seconds"]
    assert len(c) == world and len(w) == world, r
    assert all(x > 0 for x in c) and all(x >= 0 for x in w), r
    assert 0 <= r["slowest_rank"] < world and r["slowest_compute_seconds"] == max(c), r
    assert c[r["slowest_rank"]] == max(c), r
    assert r["slowest_compute_seconds"] >= r["median_compute_seconds"] > 0, r
    assert r["compute_spread"] >= 0, r
    if world == 1:
        assert r["slowest_rank"] == 0 and r["compute_spread"] == 0, r
        assert r["median_compute_seconds"] == c[0], r
EOF
}

echo "== world size 1"
timeout -k 5 60 "$bin" "${run[@]}" --epochs 2 --metrics "$tmp/w1.jsonl" > "$tmp/w1.out" 2>&1 \
  || fail "1-rank run failed: $(tail -3 "$tmp/w1.out")"
check_records "$tmp/w1.jsonl" 1
grep -q "slowest r" "$tmp/w1.out" && fail "the epoch line of a 1-rank run names a slowest rank"

echo "== world size 2, no throttle: no warning"
timeout -k 5 60 "${mpi[@]}" -np 2 "$bin" "${run[@]}" --metrics "$tmp/even.jsonl" > "$tmp/even.out" 2>&1 \
  || fail "2-rank run failed: $(tail -3 "$tmp/even.out")"
check_records "$tmp/even.jsonl" 2
grep -q "slower than the median" "$tmp/even.out" && fail "an unthrottled run warned: $(grep slower "$tmp/even.out")"
grep -q "^epoch 5/5 .* slowest r[01] +[0-9]*%$" "$tmp/even.out" \
  || fail "the epoch line lacks the slowest rank: $(grep '^epoch' "$tmp/even.out" | tail -1)"

echo "== world size 2, rank 1 stopped 75 ms of every 100 ms"
"${mpi[@]}" -np 2 "$bin" "${run[@]}" --metrics "$tmp/slow.jsonl" > "$tmp/slow.out" 2>&1 &
job=$!
p=""
for _ in $(seq 100); do
  for c in $(pgrep -P "$job"); do
    tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && p=$c
  done
  [[ -n $p ]] && break
  sleep 0.1
done
[[ -n $p ]] || fail "no rank 1 process found"
# The duty cycle ends by itself when rank 1 exits (kill -STOP fails).
(while kill -STOP "$p" 2>/dev/null; do sleep 0.075; kill -CONT "$p" 2>/dev/null; sleep 0.025; done) &
throttler=$!
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  fail "throttled run did not end within 60 s"
else
  wait "$job" || fail "throttled run failed: $(tail -3 "$tmp/slow.out")"
fi
job=""
wait "$throttler" 2>/dev/null
throttler=""
check_records "$tmp/slow.jsonl" 2
grep '^epoch\|slower than the median' "$tmp/slow.out" | sed 's/^/  /'
grep -q "rank 1 (host .*) has been [0-9]*% slower than the median for 3 epochs in a row" "$tmp/slow.out" \
  || fail "no straggler warning naming rank 1"
[[ $(grep -c "slower than the median" "$tmp/slow.out") -eq 1 ]] || fail "not exactly one straggler warning"
python3 - "$tmp/slow.jsonl" <<'EOF' || fail "the epoch records do not show rank 1 as the slow one"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"epoch"' in l]
for r in recs[-3:]:
    assert r["slowest_rank"] == 1, r
    assert r["slowest_compute_seconds"] > 1.2 * r["median_compute_seconds"], r
    assert r["compute_spread"] > 0.4, r
EOF

echo "failures: $fails"
[[ $fails -eq 0 ]]
