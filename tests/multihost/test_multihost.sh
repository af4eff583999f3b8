#!/usr/bin/env bash
# Multi-host test of dptrain (meson suite `multihost`): two "hosts" made of Linux network
# namespaces joined by a veth link (10.200.0.1 <-> 10.200.0.2), each with its own hostname. mpirun
# runs in the first namespace and starts the second host's orted through tests/multihost/
# rsh_agent.sh (plm rsh), as it would over ssh. Two cases: 2 ranks (one per host) and 4 ranks (two
# per host, oversubscribed). Each runs a short LeNet training and checks: exit 0, both hostnames in
# the start-up banner, a metrics line with the world size and the full test set, and that the veth
# byte counters grew in each direction by at least the gradient size x optimizer steps (the
# gradient all-reduce crossed the link). The namespaces (and anything still running in them) are
# removed at the end, on failure too.
#
# Usage: test_multihost.sh path/to/dptrain
# Exit: 0 pass, 1 fail, 77 skip (meson's skip code) with the reason where namespaces cannot be
# made here (not root, no `ip netns`, no unshare, no veth) or mpirun / the data set are missing.
set -euo pipefail
# shellcheck source=tests/multihost/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
wait_s=${DPT_MH_TIMEOUT:-120}   # bound of each mpirun run

tx_bytes() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes"; }

grad_bytes=$((129068 * 4))   # LeNet: 129,068 float parameters per all-reduce

# run_case NP SLOTS_PER_HOST
run_case() {
  local np=$1 slots=$2 dir=$tmp/np$1
  mkdir -p "$dir"
  printf '%s slots=%s\n%s slots=%s\n' "$ipA" "$slots" "$ipB" "$slots" >"$dir/hostfile"
  local extra=()
  ((np > $(nproc))) && extra+=(--oversubscribe)
  local a0 b0 a1 b1
  a0=$(tx_bytes "$nsA" vethA)
  b0=$(tx_bytes "$nsB" vethB)

  echo "=== case np=$np ($slots rank(s) per host)"
  local t0=$SECONDS rc=0
  # mpirun runs on the first host: its namespace, its hostname.
  timeout -k 10 "$wait_s" "${on_host_a[@]}" mpirun --allow-run-as-root "${extra[@]}" --bind-to none -np "$np" \
    --hostfile "$dir/hostfile" \
    --mca plm rsh --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.200.0.0/24 --mca oob_tcp_if_include 10.200.0.0/24 \
    -x OMP_NUM_THREADS=1 \
    "$dptrain" --model lenet --epochs 1 --max-steps 10 --batch-size 64 --eval-batch-size 2000 \
    --metrics "$dir/m.jsonl" --timeout 60 \
    </dev/null >"$dir/out.txt" 2>&1 || rc=$?
  local took=$((SECONDS - t0))
  out_file=$dir/out.txt
  # The banner's hosts and the epoch line (the whole output is shown if a check fails).
  grep -E '^dptrain:|^  rank [0-9]+:|^epoch ' "$dir/out.txt" | sed 's/^/  | /' || true
  ((rc != 124 && rc != 137)) || fail "np=$np: mpirun did not finish within ${wait_s}s"
  ((rc == 0)) || fail "np=$np: mpirun exited with $rc"

  a1=$(tx_bytes "$nsA" vethA)
  b1=$(tx_bytes "$nsB" vethB)

  grep -q "world size $np" "$dir/out.txt" || fail "np=$np: banner does not say 'world size $np'"
  local h
  for h in "$hostA" "$hostB"; do
    grep -Eq "rank [0-9]+: $h," "$dir/out.txt" || fail "np=$np: no rank on host $h in the banner"
  done
  # Ranks per host as placed by the hostfile.
  local na nb
  na=$(grep -Ec "rank [0-9]+: $hostA," "$dir/out.txt" || true)
  nb=$(grep -Ec "rank [0-9]+: $hostB," "$dir/out.txt" || true)
  ((na == slots && nb == slots)) || fail "np=$np: ranks per host $na/$nb, expected $slots/$slots"

  [[ -s $dir/m.jsonl ]] || fail "np=$np: no metrics written"
  local line steps
  line=$(tail -n 1 "$dir/m.jsonl")
  echo "  metrics: $line"
  [[ $line =~ \"world_size\":\ *${np}[,}\ ] ]] || fail "np=$np: metrics lack \"world_size\": $np"
  [[ $line =~ \"test_count\":\ *10000[,}\ ] ]] || fail "np=$np: metrics lack \"test_count\": 10000"
  [[ $line =~ \"steps\":\ *([0-9]+) ]] || fail "np=$np: metrics lack \"steps\""
  steps=${BASH_REMATCH[1]}
  ((steps > 0)) || fail "np=$np: no optimizer steps"

  # Each side must receive every gradient value of the other side once per step at least, so
  # each direction of the link carries >= gradient bytes x steps.
  local da=$((a1 - a0)) db=$((b1 - b0)) need=$((grad_bytes * steps))
  echo "  veth tx bytes: $hostA->$hostB $da, $hostB->$hostA $db" \
    "(need >= $need each: $grad_bytes B x $steps steps); ${took}s"
  ((da >= need)) || fail "np=$np: only $da bytes went $hostA->$hostB, expected >= $need"
  ((db >= need)) || fail "np=$np: only $db bytes went $hostB->$hostA, expected >= $need"
  echo "  ok"
  out_file=''
}

run_case 2 1
run_case 4 2
echo "PASS: multihost (2 and 4 ranks over a veth link)"
