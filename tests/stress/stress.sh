#!/usr/bin/env bash
# Stress (outside CI): N short 2-rank training jobs in a row (default 30); any hang (a job past
# its time limit) or nonzero exit fails the run. Each job varies the seed and the bucket size so
# different bucket plans and interleavings of the communication thread are exercised.
# Usage: tests/stress/stress.sh [jobs] [build-dir]
set -uo pipefail
jobs=${1:-30}
build=${2:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/$build/dptrain
[[ -x $bin ]] || { echo "stress: $bin not found (build first)"; exit 2; }
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
buckets=(0.01 0.1 1 25)
fails=0
t0=$SECONDS
for ((i = 1; i <= jobs; i++)); do
  mb=${buckets[i % ${#buckets[@]}]}
  start=$SECONDS
  out=$(timeout -k 5 120 bash "$root/launch/mpirun.sh" -np 2 "$bin" --model lenet --epochs 1 \
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
[[ $fails -eq 0 ]]
