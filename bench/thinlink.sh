#!/usr/bin/env bash
# Thin-link bench: two "hosts" (Linux network namespaces joined by a veth pair, rate-limited with
# tc's token bucket filter on both ends) run dptrain at 2 ranks (one per host) and 4 ranks (two
# per host), for LeNet and ResNet-18, fp32 and bf16 gradient buckets and a few bucket sizes, and
# report per step: step time, all-reduce time, the part of it hidden behind backward. An
# all-reduce sweep (bench/allreduce_bench) on each link gives the alpha-beta fit
# t = alpha_hop * 2(p-1) + 2(p-1)/p * bytes / B that bench/forecast.py takes (--link NAME ALPHA BW).
# netem is not in this kernel, so no delay is added: the veth's own latency is what alpha measures.
# Raw TCP throughput (bench/tcp_probe.py) on each link, one way and both ways at once, is printed
# beside each fit as the reference for B.
# Needs root (network namespaces, tc), iproute2, and a built tree.
# Usage: bench/thinlink.sh [--rates "1gbit 10gbit"] [--models "lenet resnet18"] [--dtypes "fp32 bf16"]
#                          [--buckets "25 5"] [--nps "2 4"] [--steps N] [--build DIR]
# Prints one markdown table (with machine, link, command and date) and the fitted alpha/beta lines.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rates="1gbit 10gbit" models="lenet resnet18" dtypes="fp32 bf16" buckets="25 5" nps="2 4" steps=8
build=$here/build
cmdline="bench/thinlink.sh $*"
while (($#)); do
  case $1 in
    --rates) rates=$2 ;; --models) models=$2 ;; --dtypes) dtypes=$2 ;; --buckets) buckets=$2 ;;
    --nps) nps=$2 ;; --steps) steps=$2 ;; --build) build=$(realpath "$2") ;;
    *) echo "thinlink: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2 || { echo "thinlink: $1 needs a value" >&2; exit 2; }
done
bin=$build/dptrain arb=$build/bench/allreduce_bench agent=$here/tests/multihost/rsh_agent.sh
[[ -x $bin && -x $arb ]] || { echo "thinlink: build first ($bin, $arb)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "thinlink: needs root (network namespaces, tc)" >&2; exit 2; }
command -v tc >/dev/null || { echo "thinlink: tc (iproute2) is missing" >&2; exit 2; }

tag=dpttl$$ nsA=dpttl$$a nsB=dpttl$$b hostA=tl-a-$$ hostB=tl-b-$$ ipA=10.200.0.1 ipB=10.200.0.2
tmp=$(mktemp -d)
cleanup() {
  for ns in "$nsA" "$nsB"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns delete "$ns" 2>/dev/null
  done
  rm -f /dev/shm/*."$hostA".* /dev/shm/*."$hostB".* 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ip netns add "$nsA" && ip netns add "$nsB" || exit 1
ip -n "$nsA" link add vethA type veth peer name vethB netns "$nsB" || exit 1
ip -n "$nsA" addr add "$ipA/24" dev vethA && ip -n "$nsB" addr add "$ipB/24" dev vethB
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set vethA up && ip -n "$nsB" link set vethB up
export DPT_MH_HOSTS="$ipA=$nsA:$hostA $ipB=$nsB:$hostB" SHELL=/bin/sh OMP_NUM_THREADS=1
sleep 1

# Shapes both directions of the link to $1 (an integer with kbit, mbit or gbit): tbf with a burst
# of 4 ms at that rate (at least 64 KiB, as tbf needs rate/HZ) and a 50 ms queue (a short queue
# drops packets of a 16 MiB all-reduce and TCP's recovery, not the link, sets the time).
shape() {
  local num=${1%%[a-z]*} unit=${1##*[0-9]} mul burst pair ns dev
  case $unit in
    kbit) mul=1000 ;; mbit) mul=1000000 ;; gbit) mul=1000000000 ;;
    *) echo "thinlink: rate '$1' is not NNkbit, NNmbit or NNgbit" >&2; exit 2 ;;
  esac
  burst=$((num * mul / 8 / 250))
  ((burst < 65536)) && burst=65536
  for pair in "$nsA vethA" "$nsB vethB"; do
    read -r ns dev <<<"$pair"
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$1" burst "$burst" latency 50ms || exit 1
  done
}
# mpirun from host A over both hosts, $1 ranks (half on each), then the program and its args.
mpi_on_hosts() {
  local np=$1
  shift
  printf '%s slots=%s\n%s slots=%s\n' "$ipA" $((np / 2)) "$ipB" $((np / 2)) >"$tmp/hosts"
  timeout -k 10 900 ip netns exec "$nsA" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$hostA" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" --hostfile "$tmp/hosts" \
    --mca plm rsh --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 --mca pml ob1 \
    --mca btl self,vader,tcp --mca btl_tcp_if_include 10.200.0.0/24 --mca oob_tcp_if_include 10.200.0.0/24 \
    -x OMP_NUM_THREADS=1 "$@" </dev/null
}

echo "# Thin links: $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "# command: $cmdline"
echo
echo "| link | model | ranks | grads | bucket MiB | step s | all-reduce s | hidden s | exposed s | img/s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
fits=()
for rate in $rates; do
  shape "$rate"
  # Raw TCP on this link (bench/tcp_probe.py), the reference for B: one stream A -> B, then one
  # each way at once (a 2-rank ring all-reduce sends both ways at once).
  probe=$here/bench/tcp_probe.py mib=$((${rate%%[a-z]*} * 64))
  [[ $rate == *gbit ]] || mib=16
  ip netns exec "$nsB" python3 "$probe" serve 5201 >"$tmp/p1" &
  ip netns exec "$nsA" python3 "$probe" send "$ipB" 5201 "$mib" >/dev/null
  wait
  ip netns exec "$nsB" python3 "$probe" serve 5202 >"$tmp/p2" &
  ip netns exec "$nsA" python3 "$probe" serve 5203 >"$tmp/p3" &
  ip netns exec "$nsA" python3 "$probe" send "$ipB" 5202 "$mib" >/dev/null &
  ip netns exec "$nsB" python3 "$probe" send "$ipA" 5203 "$mib" >/dev/null
  wait
  tcp="raw TCP $(awk '{print $4}' "$tmp/p1") GB/s one way, $(awk '{print $4}' "$tmp/p2") and $(awk '{print $4}' "$tmp/p3") GB/s both ways at once ($mib MiB)"
  # The all-reduce sweep on this link, 2 ranks (one per host): alpha and B by least squares.
  mpi_on_hosts 2 "$arb" --iters 20 --min-bytes 4096 --max-bytes $((16 << 20)) --json >"$tmp/ar.json" 2>/dev/null
  fits+=("$rate: $(python3 - "$tmp/ar.json" <<'PY'
import json, sys
pts = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# 2 ranks: t = 2 alpha + n / B (ring: 2(p-1)/p = 1). B from the sizes of 1 MiB and more (least
# squares of t on n), alpha from the smallest size: one least-squares line over all sizes lets the
# large sizes' queueing set alpha (it came out negative at 1 Gb/s).
pts.sort(key=lambda p: p["bytes"])
big = [(p["bytes"], p["mpi_us"] * 1e-6) for p in pts if p["bytes"] >= 1 << 20]
n = len(big); mx = sum(x for x, _ in big) / n; my = sum(y for _, y in big) / n
b = sum((x - mx) * (y - my) for x, y in big) / sum((x - mx) ** 2 for x, _ in big)
# The smallest size's transfer is not taken off: tbf's burst (4 ms of tokens) lets a 4 KiB message
# through at the veth's own speed, so subtracting bytes/B made alpha negative at 1 Gb/s.
small = pts[0]
alpha = small["mpi_us"] * 1e-6 / 2
print(f"alpha {alpha * 1e6:.1f} us per hop (half of {small['bytes']} B's time), B {1 / b / 1e9:.3f} GB/s (from {n} sizes >= 1 MiB); "
      f"bench/forecast.py --link NAME {alpha:.3g} {1 / b:.4g}")
PY
); $tcp")
  for model in $models; do
    batch=256
    [[ $model == resnet18 ]] && batch=64
    for np in $nps; do
      for dt in $dtypes; do
        for mb in $buckets; do
          m=$tmp/m.jsonl
          rm -f "$m"
          mpi_on_hosts "$np" "$bin" --model "$model" --epochs 1 --max-steps "$steps" --batch-size $((batch * np / 2)) \
            --eval-every 0 --grad-dtype "$dt" --bucket-mb "$mb" --metrics "$m" --timeout 300 --quiet >"$tmp/out" 2>&1 ||
            { echo "| $rate | $model | $np | $dt | $mb | failed: $(tail -1 "$tmp/out") |"; continue; }
          python3 - "$m" "$rate" "$model" "$np" "$dt" "$mb" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"type":"epoch"' in l][-1]
s = r["steps"]
step, comm, exp = r["epoch_seconds"] / s, r["comm_seconds"] / s, r["exposed_comm_seconds"] / s
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} | {step:.3f} | {comm:.3f} | {max(0.0, comm - exp):.3f} | {exp:.3f} | {r['images_per_second']:.0f} |")
PY
        done
      done
    done
  done
done
echo
for f in "${fits[@]}"; do echo "- $f"; done
