#!/usr/bin/env bash
# Checkpoint files belong to one training: two trainings that share a --checkpoint-path directory
# never prune, overwrite or resume each other's files. Training A keeps its newest 2 rotated files;
# training B (other settings) in the same place is refused where it would overwrite A's files,
# prunes only its own when it runs beside them, and --resume auto takes each run's own training,
# naming the files it passed over. Usage: test_shared_checkpoints.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$tmp" || exit 1
RUN_TIMEOUT=120  # run (lib.sh) bounds each run
id_of() { meta_of training_id "$1"; }  # the training id a checkpoint records ("" when none)
mkdir shared
base=(--eval-every 0 --batch-size 64 --checkpoint-every 2steps --keep-checkpoints 2 --checkpoint-path shared/ck.st)

echo "== training A: 2 epochs of 6 steps, the newest 2 of its checkpoints kept"
run a.log "$bin" "${base[@]}" --epochs 2 --max-steps 6 --seed 1 || fail "A failed: $(tail -2 a.log)"
[[ $(ls shared) == $'ck.step10.st\nck.step12.st' ]] || fail "A: want ck.step10.st ck.step12.st, have: $(ls shared | tr '\n' ' ')"
a_id=$(id_of shared/ck.step12.st)
[[ $a_id =~ ^[0-9a-f]{16}$ ]] || fail "A's checkpoint records no training id: '$a_id'"

echo "== training B would overwrite A's step-10 and step-12 files: refused before the first step"
run b.log "$bin" "${base[@]}" --epochs 2 --max-steps 6 --seed 2
rc=$?
[[ $rc -eq 2 ]] || fail "B over A's files: exit $rc, want 2"
grep -q "is a checkpoint of another training (id $a_id" b.log || fail "B's refusal does not name A: $(grep error b.log)"
[[ $(id_of shared/ck.step12.st) == "$a_id" ]] || fail "A's step-12 file was replaced"

echo "== training B that ends before A's files: runs, and prunes only its own"
run c.log "$bin" "${base[@]}" --epochs 1 --max-steps 8 --seed 2 || fail "B (8 steps) failed: $(tail -2 c.log)"
[[ $(ls shared) == $'ck.step10.st\nck.step12.st\nck.step6.st\nck.step8.st' ]] ||
  fail "want A's step 10, 12 and B's newest 2 (6, 8); have: $(ls shared | tr '\n' ' ')"
[[ $(id_of shared/ck.step10.st) == "$a_id" && $(id_of shared/ck.step12.st) == "$a_id" ]] || fail "A's files changed"
b_id=$(id_of shared/ck.step8.st)
[[ -n $b_id && $b_id != "$a_id" ]] || fail "B's checkpoint has A's id or none: '$b_id'"

echo "== --resume auto takes its own training's newest file and names the others"
run d.log "$bin" "${base[@]}" --epochs 1 --max-steps 8 --seed 2 --resume auto || fail "B's auto resume failed: $(tail -2 d.log)"
grep -q "resumed from shared/ck.step8.st" d.log || fail "B did not resume its own step 8: $(grep -i resum d.log)"
grep -q "passed over the files of other trainings (shared/ck.step12.st, shared/ck.step10.st)" d.log ||
  fail "B's auto resume did not name A's files: $(grep -i 'passed over' d.log)"
run e.log "$bin" "${base[@]}" --epochs 2 --max-steps 6 --seed 1 --resume auto || fail "A's auto resume failed: $(tail -2 e.log)"
grep -q "resumed from shared/ck.step12.st" e.log || fail "A did not resume its own step 12: $(grep -i resum e.log)"

echo "== --resume naming the other training's file continues that training: allowed"
run f.log "$bin" "${base[@]}" --epochs 2 --max-steps 6 --seed 1 --resume shared/ck.step10.st ||
  fail "resuming A's step 10 by name failed: $(tail -2 f.log)"
[[ $(id_of shared/ck.step12.st) == "$a_id" ]] || fail "A resumed by name wrote step 12 under another id"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
