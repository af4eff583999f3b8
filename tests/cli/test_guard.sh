#!/usr/bin/env bash
# The non-finite guard, as an operator meets it: a learning rate that blows up stops the run with
# exit 2 naming the step and the first tensor, and never writes NaN over the last good checkpoint;
# --nonfinite skip goes on up to a bound; --clip-grad-norm and the gradient norm in the metrics.
# Each run is bounded by `timeout`. Usage: test_guard.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$tmp" || exit 1

short=(--epochs 2 --max-steps 4 --eval-every 0 --checkpoint-every 1 --checkpoint-path ck.st)
echo "== a learning rate that blows up, after a good epoch (2 ranks)"
expect 0 "epoch 1/1" -- "${mpi[@]}" -np 2 "$bin" "${short[@]}" --epochs 1
cp ck.st good.st
expect 2 "the gradients are not finite (first: " -- "${mpi[@]}" -np 2 "$bin" "${short[@]}" --lr 1e6 \
  --allow-config-change --resume ck.st
grep -qE "error: step [5-8] \(epoch 2\)" out.txt || fail "the message does not name a step of epoch 2: $(grep error out.txt)"
cmp -s ck.st good.st || fail "the checkpoint was overwritten by a run that blew up"
[[ $(grep -c "error:" out.txt) -eq 1 ]] || fail "not exactly one rank printed the error"

echo "== --nonfinite skip: warned, bounded"
expect 2 "after 2 skipped steps (--nonfinite-max-skips)" -- "$bin" --epochs 1 --max-steps 8 --eval-every 0 \
  --lr 1e6 --nonfinite skip --nonfinite-max-skips 2
[[ $(grep -c "the step was skipped" out.txt) -eq 2 ]] || fail "want 2 skip warnings: $(grep -c skipped out.txt)"
expect 2 "--nonfinite must be stop or skip, got 'ignore'" -- "$bin" --nonfinite ignore
expect 2 "--clip-grad-norm must be >= 0" -- "$bin" --clip-grad-norm -1
expect 2 "--clip-grad-norm: 'nan' is not a number" -- "$bin" --clip-grad-norm nan
expect 2 "--lr: 'nan' is not a number" -- "$bin" --lr nan
expect 2 "--clip-grad-norm: 'x' is not a number" -- "$bin" --clip-grad-norm=x

echo "== gradient norms in the metrics; clipping"
expect 0 "epoch 1/1" -- "$bin" --epochs 1 --max-steps 6 --eval-every 0 --metrics m.jsonl --metrics-every 1
expect 0 "epoch 1/1" -- "$bin" --epochs 1 --max-steps 6 --eval-every 0 --metrics c.jsonl --metrics-every 1 \
  --clip-grad-norm 0.05
python3 - m.jsonl c.jsonl <<'PY' || fail "gradient norms in the metrics"
import json, math, sys
def load(p):
    rs = [json.loads(l) for l in open(p)]
    return [r for r in rs if r["type"] == "step"], [r for r in rs if r["type"] == "epoch"][-1]
steps, epoch = load(sys.argv[1])
norms = [r["grad_norm"] for r in steps]
assert len(norms) == 6 and all(math.isfinite(n) and n > 0 for n in norms), norms
# The epoch record: the mean and the largest of the steps' norms, and no skipped step.
assert abs(epoch["grad_norm"] - sum(norms) / 6) <= 1e-9 * max(norms), (epoch["grad_norm"], norms)
assert epoch["grad_norm_max"] == max(norms) and epoch["nonfinite_steps"] == 0, epoch
csteps, _ = load(sys.argv[2])
# The first step's gradients are the same either way (same start); clipping changes the path after.
assert csteps[0]["grad_norm"] == steps[0]["grad_norm"], (csteps[0], steps[0])
assert norms[0] > 0.05, "the test needs a first-step norm above the clip"
assert any(c["grad_norm"] != s["grad_norm"] for c, s in zip(csteps[1:], steps[1:])), "clipping changed nothing"
print("norms", [round(n, 4) for n in norms])
PY

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
