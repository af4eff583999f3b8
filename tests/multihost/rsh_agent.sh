#!/usr/bin/env bash
# rsh/ssh stand-in for tests/multihost/test_multihost.sh: Open MPI's rsh launcher (plm rsh) calls it
# as `rsh_agent.sh [options] HOST CMD...` to start orted on HOST. Each test "host" is a Linux network
# namespace; this runs CMD inside the namespace mapped to HOST, in a fresh UTS namespace with that
# host's own hostname (without distinct hostnames, two ranks per host collide on the shared-memory
# segment names /dev/shm/vader_segment.<host>.* and hang).
#
# The map comes from the environment (mpirun passes its environment to the agent):
#   DPT_MH_HOSTS="HOST=NETNS:HOSTNAME HOST=NETNS:HOSTNAME ..."
# e.g. DPT_MH_HOSTS="10.200.0.1=dptmh123a:dpt-a-123 10.200.0.2=dptmh123b:dpt-b-123"
# Like ssh, the words of CMD are joined with spaces and run by a shell (Open MPI quotes for that).
set -euo pipefail

# Skip rsh/ssh options (Open MPI may add some, e.g. from plm_rsh_args); those that take a value
# skip it as well.
while (($#)) && [[ $1 == -* ]]; do
  case $1 in
    --) shift; break ;;
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 || true ;;
    *) shift ;;
  esac
done
if (($# < 2)); then
  echo "rsh_agent.sh: usage: rsh_agent.sh [options] HOST CMD..." >&2
  exit 255
fi
host=$1
shift

netns='' name=''
for entry in ${DPT_MH_HOSTS:-}; do
  if [[ ${entry%%=*} == "$host" ]]; then
    value=${entry#*=}
    netns=${value%%:*}
    name=${value#*:}
  fi
done
if [[ -z $netns || -z $name ]]; then
  echo "rsh_agent.sh: host '$host' is not in DPT_MH_HOSTS='${DPT_MH_HOSTS:-}'" >&2
  exit 255
fi

# Like ssh, the agent stays on the calling host while the command runs on the other, and ends when
# that command does or when it is killed; killed, it leaves the command running, as an ssh killed
# while the link is down leaves the remote daemon. (An exec would move it to the other host, where
# the first host's checks cannot see it: an agent left behind by a launcher went unnoticed.)
# shellcheck disable=SC2016  # $0 and $1 are for the inner sh
# $0 of the inner shell is the hostname, $1 the command line (like ssh, one string for a shell).
ip netns exec "$netns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*" <&0 &
wait $!
