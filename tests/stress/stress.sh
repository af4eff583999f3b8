#!/usr/bin/env bash
# Stress (outside CI), two parts:
#  1. N short 2-rank training jobs in a row (default 30); any hang (a job past its time limit) or
#     nonzero exit fails the run. Each job varies the seed and the bucket size so that different
#     bucket plans and interleavings of the communication thread are exercised.
#  2. M interrupted runs (default 5): one 2-rank LeNet run (3 epochs of 150 steps, a checkpoint
#     every 25 steps, a metrics record per step) is interrupted at random moments by a random blow:
#     SIGKILL of a random rank, SIGTERM or SIGINT to launch/mpirun.sh, SIGUSR1 to mpirun, or a
#     kill of the launcher's whole process tree; after each it is started again with --resume auto,
#     until it completes. It must end bit for bit where an uninterrupted run ends, with every
#     step's metrics record exactly once (no step lost, none repeated).
# Usage: tests/stress/stress.sh [jobs] [build-dir] [interrupted-runs]
set -uo pipefail
jobs=${1:-30}
build=${2:-build}
runs=${3:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/$build/dptrain
launcher=$root/launch/mpirun.sh
[[ -x $bin ]] || { echo "stress: $bin not found (build first)"; exit 2; }
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
buckets=(0.01 0.1 1 25)
fails=0
t0=$SECONDS
for ((i = 1; i <= jobs; i++)); do
  mb=${buckets[i % ${#buckets[@]}]}
  start=$SECONDS
  out=$(timeout -k 5 120 bash "$launcher" -np 2 "$bin" --model lenet --epochs 1 \
        --max-steps 20 --batch-size 64 --eval-batch-size 2000 --seed "$i" --bucket-mb "$mb" \
        --timeout 30 --verify-every 5 --quiet 2>&1)
  rc=$?
  if [[ $rc -ne 0 ]]; then
    fails=$((fails + 1))
    echo "job $i (bucket-mb $mb): FAILED rc $rc$([[ $rc -eq 124 ]] && echo ' (hang)')"
    tail -5 <<<"$out"
  else
    echo "job $i (bucket-mb $mb): ok in $((SECONDS - start)) s: $(tail -1 <<<"$out")"
  fi
done
echo "stress: $jobs jobs, $fails failed, $((SECONDS - t0)) s"

# ---- part 2: interrupted and resumed runs ----
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
flags=(--model lenet --epochs 3 --max-steps 150 --batch-size 128 --eval-batch-size 2000 --seed 11
       --checkpoint-every 25steps --metrics-every 1 --timeout 20 --quiet)
run() {  # run DIR [extra flags]: one bounded launch with outputs in DIR, in the background ($job)
  local dir=$1
  shift
  set -m  # own process group, and SIGINT not ignored (see tests/cli/test_signals.sh)
  timeout -k 5 300 bash "$launcher" -np 2 "$bin" "${flags[@]}" --checkpoint-path "$dir/ck.st" \
    --metrics "$dir/m.jsonl" --save "$dir/final.st" "$@" >>"$dir/log" 2>&1 &
  job=$!
  set +m
}
mkdir "$tmp/ref"
run "$tmp/ref"
wait "$job" || { echo "stress: the reference run failed: $(tail -3 "$tmp/ref/log")"; exit 1; }
blows=(kill-rank term-launcher int-launcher usr1-mpirun kill-tree)
for ((r = 1; r <= runs; r++)); do
  dir=$tmp/run$r
  mkdir "$dir"
  resume=()
  hits=()
  for ((attempt = 1; attempt <= 20; attempt++)); do
    run "$dir" "${resume[@]}"
    resume=(--resume auto)
    sleep "$((1 + RANDOM % 4)).$((RANDOM % 10))"
    if ! kill -0 "$job" 2>/dev/null; then
      wait "$job" && break
      echo "run $r attempt $attempt: failed by itself: $(tail -2 "$dir/log")"
      fails=$((fails + 1))
      continue 2
    fi
    blow=${blows[RANDOM % ${#blows[@]}]}
    mpirun_pid=$(pgrep -P "$(pgrep -P "$job" | head -1)" -x mpirun | head -1)
    case $blow in
      kill-rank)
        p=$(pgrep -f -- "$dir/ck.st" | while read -r q; do
              tr '\0' '\n' <"/proc/$q/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$((RANDOM % 2))" && echo "$q"
            done | head -1)
        [[ -n $p ]] && kill -9 "$p" ;;
      term-launcher) pkill -TERM -f "^bash $launcher -np 2 $bin .*$dir/ck.st" ;;
      int-launcher) pkill -INT -f "^bash $launcher -np 2 $bin .*$dir/ck.st" ;;
      usr1-mpirun) [[ -n $mpirun_pid ]] && kill -USR1 "$mpirun_pid" ;;
      kill-tree) pkill -9 -f -- "$dir/ck.st" ;;
    esac
    hits+=("$blow")
    wait "$job"
    pkill -9 -f -- "$dir/ck.st" 2>/dev/null  # what a SIGKILLed launcher left
    sleep 0.5
  done
  if [[ ! -f $dir/final.st ]]; then
    echo "run $r: did not complete in 20 attempts (${hits[*]})"
    fails=$((fails + 1))
    continue
  fi
  python3 "$root/tests/cli/same_tensors.py" "$tmp/ref/final.st" "$dir/final.st" >/dev/null &&
  python3 "$root/tests/cli/same_steps.py" "$tmp/ref/m.jsonl" "$dir/m.jsonl" >/dev/null
  if [[ $? -eq 0 ]]; then
    echo "run $r: ok after ${#hits[@]} blow(s) (${hits[*]}): bit for bit, every step once"
  else
    echo "run $r: FAILED after ${hits[*]}: differs from the uninterrupted run"
    fails=$((fails + 1))
  fi
done
echo "stress: $jobs jobs and $runs interrupted runs, $fails failed, $((SECONDS - t0)) s"
[[ $fails -eq 0 ]]
