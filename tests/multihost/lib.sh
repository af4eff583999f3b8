# What the multihost tests share (sourced after `set -euo pipefail`, with the dptrain binary as $1):
# skip and fail, the prerequisites, and two "hosts" made of Linux network namespaces joined by a
# veth link (10.200.0.1 <-> 10.200.0.2), each with its own hostname. Processes on the first host
# start the second host's through rsh_agent.sh, as mpirun does over ssh. On exit the namespaces
# are removed, with anything still running in them.
# Defines: dptrain, here, agent, data, tmp, nsA nsB, hostA hostB, ipA ipB, DPT_MH_HOSTS (for the
# agent); "${on_host_a[@]}" CMD... (CMD on the first host: its namespace, its hostname);
# running_on NS [NAME] (what runs in namespace NS: command names, or the pids named NAME);
# out_file (shown by fail).
# Exit codes: 0 pass, 1 fail, 77 skip (meson's) with the reason where namespaces cannot be made
# here (not root, no `ip netns`, no unshare, no veth) or mpirun / the data set are missing.
# shellcheck shell=bash disable=SC2034  # the variables are for the tests that source this

skip() { echo "SKIP: $*"; exit 77; }
out_file=''   # output of the run in progress, shown in full when a check fails
fail() {
  [[ -n $out_file && -f $out_file ]] && sed 's/^/  | /' "$out_file" >&2
  echo "FAIL: $*" >&2
  exit 1
}

(($# >= 1)) || { echo "usage: $0 path/to/dptrain" >&2; exit 2; }
dptrain=$(realpath "$1")
[[ -x $dptrain ]] || fail "dptrain binary '$1' not found or not executable"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent=$here/rsh_agent.sh
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}

# ---- can this machine host the test? -------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
command -v unshare >/dev/null || skip "unshare (util-linux) is missing"
command -v timeout >/dev/null || skip "timeout (coreutils) is missing"
command -v mpirun >/dev/null || skip "mpirun is missing"
ip netns list >/dev/null 2>&1 || skip "this ip has no 'ip netns' support"
[[ -d $data ]] || skip "data set directory $data is missing"

# Unique names so parallel runs do not collide: namespaces and hostnames carry the PID. The
# addresses 10.200.0.x live only inside these namespaces.
tag=dptmh$$
nsA=${tag}a nsB=${tag}b
hostA=dpt-a-$$ hostB=dpt-b-$$
ipA=10.200.0.1 ipB=10.200.0.2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dpt-multihost.XXXXXX")

cleanup() {
  local rc=$? ns pids
  trap - EXIT INT TERM HUP
  for ns in "$nsA" "$nsB"; do
    if ip netns list 2>/dev/null | grep -qw "^$ns"; then
      # Processes this test started in its own namespaces (a stuck orted or rank), by PID.
      read -r -d '' -a pids < <(ip netns pids "$ns" 2>/dev/null) || true
      if ((${#pids[@]})); then kill -KILL "${pids[@]}" 2>/dev/null || true; fi
      ip netns delete "$ns" 2>/dev/null || echo "warning: could not delete namespace $ns" >&2
    fi
  done
  # Shared-memory segments and Open MPI session directories of killed ranks and daemons (their
  # names carry this run's hostnames).
  rm -f /dev/shm/*."$hostA".* /dev/shm/*."$hostB".* 2>/dev/null || true
  rm -rf "${TMPDIR:-/tmp}/ompi.$hostA."* "${TMPDIR:-/tmp}/ompi.$hostB."* 2>/dev/null || true
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---- the two hosts ---------------------------------------------------------------------------
err=$(ip netns add "$nsA" 2>&1) || skip "cannot create network namespaces here (ip netns add: $err)"
err=$(ip netns add "$nsB" 2>&1) || skip "cannot create a second network namespace (ip netns add: $err)"
err=$(ip -n "$nsA" link add vethA type veth peer name vethB netns "$nsB" 2>&1) ||
  skip "cannot create a veth pair between namespaces ($err)"
ip -n "$nsA" addr add "$ipA/24" dev vethA
ip -n "$nsB" addr add "$ipB/24" dev vethB
for ns in "$nsA" "$nsB"; do
  ip -n "$ns" link set lo up
done
ip -n "$nsA" link set vethA up
ip -n "$nsB" link set vethB up
echo "hosts: $hostA ($ipA, netns $nsA) <-> $hostB ($ipB, netns $nsB) over veth"

# Wait for the link to come up (a veth is usually up at once; bounded).
for ((i = 0; i < 50; i++)); do
  [[ $(ip netns exec "$nsB" cat /sys/class/net/vethB/operstate) == up ]] && break
  sleep 0.1
done

export DPT_MH_HOSTS="$ipA=$nsA:$hostA $ipB=$nsB:$hostB"
export SHELL=/bin/sh   # Open MPI builds the remote command for the local shell's syntax

# The agent reaches the second host and gives it its hostname.
got=$(timeout 20 bash "$agent" "$ipB" hostname) || fail "rsh agent could not run a command on $ipB"
[[ $got == "$hostB" ]] || fail "rsh agent: hostname on $ipB is '$got', expected '$hostB'"

# A command prefix that runs what follows on the first host: in its namespace, under its hostname
# (mpirun, or the launcher, runs there and starts the second host's daemon through the agent).
# shellcheck disable=SC2016  # $0 and $@ are for the inner sh
on_host_a=(ip netns exec "$nsA" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$hostA")

# The command names of the processes in namespace $1, on one line ("" when none); with a name $2,
# the pids of the processes of that name instead.
running_on() {
  local p name out=()
  for p in $(ip netns pids "$1" 2>/dev/null); do
    { read -r name <"/proc/$p/comm"; } 2>/dev/null || continue
    if (($# < 2)); then out+=("$name"); elif [[ $name == "$2" ]]; then out+=("$p"); fi
  done
  echo "${out[*]}"
}
