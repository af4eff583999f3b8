#!/usr/bin/env bash
# mpirun, on one host or across hosts, with what these machines need and what plain mpirun lacks:
#  - --allow-run-as-root only as root, --oversubscribe only with more ranks than cores, and the ob1
#    PML (MPI_Init in ~20 ms instead of ~225 ms probing UCX);
#  - stops that checkpoint: SIGTERM, SIGINT or SIGHUP sent to this script reach every rank on every
#    host as SIGUSR1, which mpirun forwards (to TERM or INT mpirun answers by killing the ranks 1 s
#    later, too soon for a step and a checkpoint). The ranks finish their step, write the
#    checkpoint and exit; then this script exits 128 + its signal (143, 130, 129). A second signal
#    kills the job at once;
#  - --max-restarts N: a job that fails after writing a new checkpoint runs again with --resume auto;
#  - across hosts: ssh with ConnectTimeout and BatchMode, and every remote host tried before mpirun
#    starts, so that an unreachable or password-asking host fails in seconds, named.
# Usage: launch/mpirun.sh [--max-restarts N] [--ssh-timeout S] -np N program [args...]
set -uo pipefail
me=launch/mpirun.sh
die() {
  echo "$me: error: $*" >&2
  exit 2
}

max_restarts=0
ssh_timeout=10
while (($#)); do
  case $1 in
    --max-restarts | --ssh-timeout)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      [[ $1 == --max-restarts ]] && max_restarts=$2 || ssh_timeout=$2
      shift 2 ;;
    --max-restarts=*) max_restarts=${1#*=}; shift ;;
    --ssh-timeout=*) ssh_timeout=${1#*=}; shift ;;
    *) break ;;
  esac
done
[[ $max_restarts =~ ^[0-9]{1,4}$ ]] || die "--max-restarts: '$max_restarts' is not a whole number from 0 to 9999"
[[ $ssh_timeout =~ ^[0-9]{1,4}$ ]] && ((ssh_timeout > 0)) ||
  die "--ssh-timeout: '$ssh_timeout' is not a whole number of seconds from 1 to 9999"
(($#)) || die "usage: $me [--max-restarts N] [--ssh-timeout S] -np N program [args...]"

# What the command line says: the rank count, the hosts, and the dptrain flags the restarts need.
np=1 hosts=() hostfiles=() ckpt=checkpoint.safetensors ckpt_every="" rsh_args_given=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} v=${args[i + 1]:-}
  case $a in
    -np | -n | --np | -c) np=$v ;;
    --host | -host | -H) IFS=, read -ra hs <<<"$v" && hosts+=("${hs[@]}") ;;
    --hostfile | -hostfile | --machinefile | -machinefile | --default-hostfile) hostfiles+=("$v") ;;
    --checkpoint-path) ckpt=$v ;;
    --checkpoint-path=*) ckpt=${a#*=} ;;
    --checkpoint-every | --checkpoint-every=*) ckpt_every=1 ;;
    --mca | -mca) [[ $v == plm_rsh_args ]] && rsh_args_given=1 ;;
  esac
done
[[ -n ${OMPI_MCA_plm_rsh_args:-} ]] && rsh_args_given=1
for f in "${hostfiles[@]}"; do
  [[ -r $f ]] || die "hostfile '$f' cannot be read"
  while read -r h _; do
    [[ -n $h && $h != \#* ]] && hosts+=("$h")
  done <"$f"
done

extra=()
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
[[ $np =~ ^[0-9]+$ ]] && ((np > $(nproc))) && extra+=(--oversubscribe)
# Ranks' stderr is a pipe under mpirun: tell them whether the user's terminal is there.
[[ -t 2 ]] && extra+=(-x DPT_PROGRESS=1)
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}

# ---- across hosts: the remote hosts answer, or the job does not start ----
# mpirun starts its daemons with this agent (ssh unless OMPI_MCA_plm_rsh_agent says otherwise).
read -ra agent <<<"${OMPI_MCA_plm_rsh_agent:-ssh}"
[[ ${agent[0]:-} ]] || agent=(ssh)
ssh_opts=(-o ConnectTimeout="$ssh_timeout" -o BatchMode=yes)
((rsh_args_given)) || extra+=(--mca plm_rsh_args "${ssh_opts[*]}")
# A host mpirun runs on without the agent, as Open MPI decides: this host's names, and addresses of
# its interfaces (127.0.0.2 is not one: mpirun uses ssh for it).
is_local() {
  local h=$1 a mine
  mine=" 127.0.0.1 ::1 $(hostname -I 2>/dev/null) "
  [[ $h == localhost || $h == "$(hostname)" || $h == "$(hostname -s)" || $mine == *" $h "* ]] && return 0
  for a in $(getent hosts "$h" 2>/dev/null | cut -d' ' -f1); do
    [[ $mine == *" $a "* ]] && return 0
  done
  return 1
}
remote=()
for h in "${hosts[@]}"; do
  h=${h%%:*}
  is_local "$h" || [[ " ${remote[*]} " == *" $h "* ]] || remote+=("$h")
done
if ((${#remote[@]})); then
  command -v "${agent[0]}" >/dev/null || die "'${agent[0]}' not found: mpirun needs it to start ranks on ${remote[*]} (apt-get install openssh-client)"
  # All at once, each bounded: ConnectTimeout covers the connection and ssh's greeting, timeout(1)
  # anything after it (a login that hangs).
  pids=() outs=()
  for h in "${remote[@]}"; do
    outs+=("$(mktemp)")
    timeout -k 2 $((ssh_timeout + 5)) "${agent[@]}" "${ssh_opts[@]}" "$h" true </dev/null >"${outs[-1]}" 2>&1 &
    pids+=($!)
  done
  bad=0
  for i in "${!remote[@]}"; do
    wait "${pids[i]}"
    rc=$?
    if ((rc != 0)); then
      why=$(tr '\n' ' ' <"${outs[i]}")
      ((rc == 124)) && why="no answer within $((ssh_timeout + 5)) s"
      echo "$me: error: host '${remote[i]}' cannot be reached with '${agent[*]} ${ssh_opts[*]} ${remote[i]}' (exit $rc): ${why:-no message}" >&2
      bad=1
    fi
    rm -f "${outs[i]}"
  done
  ((bad)) && die "not starting: mpirun would wait on the host(s) above. Check the name, the network and that ssh logs in without a password (BatchMode)."
fi

# ---- the job, run again after a failure when restarts are allowed ----
# Checkpoint files as they are now (name, inode, size, time): a new checkpoint is written to a
# temporary file and renamed, so any new one changes this.
fingerprint() {
  local dir stem ext
  dir=$(dirname -- "$ckpt") stem=$(basename -- "$ckpt")
  ext=""
  [[ $stem == *.* ]] && ext=.${stem##*.} stem=${stem%.*}
  stat -c '%n %i %s %Y' -- "$ckpt" "$dir/$stem".step*"$ext" 2>/dev/null
}
((max_restarts > 0)) && [[ -z $ckpt_every ]] &&
  echo "$me: warning: --max-restarts $max_restarts without --checkpoint-every: no checkpoint is written, so a failed job is not restarted" >&2

got=0    # the signal this script received
child="" # mpirun's pid
on_signal() {
  local name=$1 num=$2
  if ((got)); then
    echo "$me: second $name: killing the job without waiting for the checkpoint" >&2
    [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
    return
  fi
  got=$num
  echo "$me: $name: every rank finishes its step, writes the checkpoint (if --checkpoint-every is on) and stops; $name again kills at once" >&2
  [[ -n $child ]] && kill -USR1 "$child" 2>/dev/null
}
trap 'on_signal SIGHUP 1' HUP
trap 'on_signal SIGINT 2' INT
trap 'on_signal SIGTERM 15' TERM

# mpirun in its own process group (job control on), so that a terminal's Ctrl-C reaches this script
# only, and not mpirun's kill-after-1-s. Its stdin is not the terminal: a background process group
# that read it would be stopped.
set -m
attempt=0
cmd=("$@")
while :; do
  before=$(fingerprint)
  mpirun "${extra[@]}" --bind-to none "${cmd[@]}" </dev/null &
  child=$!
  # wait returns early when a trapped signal arrives; wait again until mpirun itself has ended.
  while :; do
    wait "$child"
    rc=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=""
  if ((got)); then
    echo "$me: stopped by signal $got (the job exited with $rc); exit $((128 + got))" >&2
    exit $((128 + got))
  fi
  # Done, refused input (2) or a stop asked of the ranks themselves (128 + HUP, INT, USR1, TERM):
  # a restart would not help.
  case $rc in 0 | 2 | 129 | 130 | 138 | 143) exit "$rc" ;; esac
  ((attempt < max_restarts)) || {
    ((max_restarts)) && echo "$me: the job failed with exit $rc; no restarts left ($max_restarts used)" >&2
    exit "$rc"
  }
  after=$(fingerprint)
  if [[ -z $after || $after == "$before" ]]; then
    echo "$me: the job failed with exit $rc without writing a checkpoint since it started: not restarting" >&2
    exit "$rc"
  fi
  attempt=$((attempt + 1))
  echo "$me: the job failed with exit $rc after writing a checkpoint; restart $attempt of $max_restarts with --resume auto" >&2
  # The same command with --resume auto in place of any --resume.
  next=()
  for ((i = 0; i < ${#cmd[@]}; i++)); do
    case ${cmd[i]} in
      --resume) i=$((i + 1)) ;;
      --resume=*) ;;
      *) next+=("${cmd[i]}") ;;
    esac
  done
  cmd=("${next[@]}" --resume auto)
done
