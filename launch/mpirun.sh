#!/usr/bin/env bash
# mpirun, on one host or across hosts, with what these machines need and what plain mpirun lacks:
#  - --allow-run-as-root only as root, --oversubscribe only with more ranks than cores, and the ob1
#    PML (MPI_Init in ~20 ms instead of ~225 ms probing UCX);
#  - stops that checkpoint: SIGTERM, SIGINT or SIGHUP sent to this script reach every rank on every
#    host as SIGUSR1, which mpirun forwards (to TERM or INT mpirun answers by killing the ranks 1 s
#    later, too soon for a step and a checkpoint). The ranks finish their step, write the
#    checkpoint and exit; then this script exits 128 + its signal (143, 130, 129). A second signal
#    kills the job at once;
#  - --max-restarts N: a job that fails after writing a new checkpoint runs again with --resume auto
#    (rank 0 lists each checkpoint it writes in a private file, DPT_CHECKPOINT_RECORD);
#  - across hosts: ssh with ConnectTimeout and BatchMode, and every remote host tried before mpirun
#    starts, so that an unreachable or password-asking host fails in seconds, named. Every host name
#    (--host, hostfiles) is checked first: ssh takes a name that starts with '-' as an option;
#  - output that outlives its reader (`| head`, `| grep -m1`): mpirun's stdout and stderr pass
#    through relays that drain to nowhere once the reader is gone; plain mpirun aborts the job;
#  - faults that end in bounded time: mpirun still running 10 s after all its ranks on this host
#    have ended (stuck in its abort path, waiting for an unreachable daemon) is killed, and this
#    script returns only after every rank it started on this host has exited.
# Usage: launch/mpirun.sh [--max-restarts N] [--ssh-timeout S] -np N program [args...]
set -uo pipefail
me=launch/mpirun.sh
# This script's own messages go to stderr, which may be a pipe whose reader has gone: a failed write
# must not kill it, and with it the job's exit code or a restart. A handler, not '' (ignored), which
# mpirun and the ranks would inherit.
trap : PIPE
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
# Read as decimal (10#): 08 passed the check and failed bash's arithmetic ("value too great for
# base"), which turned --max-restarts 08 off without a word and refused --ssh-timeout 08.
[[ $max_restarts =~ ^[0-9]{1,4}$ ]] || die "--max-restarts: '$max_restarts' is not a whole number from 0 to 9999"
[[ $ssh_timeout =~ ^[0-9]{1,4}$ ]] && ((10#$ssh_timeout > 0)) ||
  die "--ssh-timeout: '$ssh_timeout' is not a whole number of seconds from 1 to 9999"
max_restarts=$((10#$max_restarts)) ssh_timeout=$((10#$ssh_timeout))
(($#)) || die "usage: $me [--max-restarts N] [--ssh-timeout S] -np N program [args...]"

# ---- host names: checked before anything uses them ----
# quote VAR TEXT: VAR='TEXT', or $'...' with escapes where TEXT holds a control character (\r...).
quote() {
  if [[ $2 == *[[:cntrl:]]* ]]; then printf -v "$1" %q "$2"; else printf -v "$1" "'%s'" "$2"; fi
}
# A host name reaches ssh as an argument, here and in mpirun (`ssh OPTIONS HOST orted ...`): one that
# starts with '-' is an option to ssh (-oProxyCommand=... runs a command), and whitespace or a
# control character is never part of a name (an invisible \r from a CRLF hostfile made "host
# 'localhost' cannot be reached"). Names are letters, digits and . - _ : [ ] (IPv6 addresses, the
# :slots of --host) and @ (Open MPI's user@host). $1: the name, $2: where it was written.
host_re='^[][A-Za-z0-9._:@-]+$'
check_host() {
  local h=$1 where=$2 shown
  quote shown "$h"
  [[ -n $h ]] || die "$where: an empty host name"
  [[ $h == -* ]] && die "$where: host name $shown starts with '-', which ssh would take as an option"
  [[ $h =~ $host_re ]] ||
    die "$where: host name $shown has a character that host names do not have (allowed: letters, digits and . - _ : [ ] @)"
}
# strip_slots VAR: VAR's host name without --host's ':slots'. A name with two colons or more is an
# IPv6 address, kept whole: cut at its first colon, this host's fd00::2 in a hostfile became 'fd00',
# probed over ssh and refused ("host 'fd00' cannot be reached"), where mpirun runs it here, and ::1
# became '' ("seen_host: bad array subscript").
strip_slots() {
  [[ ${!1} == *:*:* ]] || printf -v "$1" %s "${!1%%:*}"
}
# --host / -H: host[:slots],host[:slots],...
host_list() {
  local flag=$1 v=$2 rest h shown
  [[ -n $v ]] || die "$flag needs a value: host[:slots],host[:slots],..."
  quote shown "$v"
  [[ $v == *$'\r' ]] && die "$flag $shown ends in a carriage return (a value read from a CRLF file?)"
  rest=$v,
  while [[ -n $rest ]]; do
    h=${rest%%,*} rest=${rest#*,}
    check_host "$h" "$flag $shown"
    hosts+=("$h")
    strip_slots h
    [[ -n ${host_where[$h]:-} ]] || host_where[$h]="$flag $shown"
  done
}
# Open MPI's hostfile: `name [slots=N] [max_slots=N]` a line, # comments and blank lines. What
# mpirun itself would refuse with exit 1 and text that does not name the line ("No nodes are
# available" for a file without a host, "should be reported to the developers" for slots=abc) is
# refused here, exit 2 naming the file and the line: no host at all, a slot count that is not a
# whole number of at least 1 (max_slots too: Open MPI 4.1 takes 0 for less than slots), max_slots
# below slots, and a host on two lines of which one gives slots (Open MPI adds them up or not, by
# version: one line with the total says what is meant; a host repeated without slots, one line per
# slot as Torque's $PBS_NODEFILE lists them, is Open MPI's usual form). Two of this host's names
# (localhost, its name, 127.0.0.1, its addresses) are one host to mpirun: with slots given, it
# failed with exit 1, "FORCE-TERMINATE ... should be reported to the developers". No command runs
# per line (builtins only): 10,000 lines take seconds, not a minute.
# A hostfile that is no regular file (a FIFO, `--hostfile <(...)`, /dev/stdin) can be read once:
# this check drained it and mpirun, reading it after, found no host ("No nodes are available for
# this job", exit 1), while plain mpirun ran. Its text is kept (hostfile_text) and mpirun given a
# copy of it (below, hostfile_at).
declare -A hostfile_text=()
read_hostfile() {
  local f=$1 line n=0 words shown w key val slots max hosts_here=0 host as fd text
  local -A first_line=() slotted=() first_name=()
  [[ -r $f && ! -d $f ]] || die "hostfile '$f' cannot be read"
  if [[ -n ${hostfile_text[$f]+set} ]]; then
    return 0 # read already (the same stream given twice)
  elif [[ ! -f $f || $f == /dev/* || $f == /proc/* ]]; then
    # /dev/stdin and /dev/fd/N too, even for a regular file: mpirun's stdin is /dev/null, and it
    # does not inherit the launcher's other descriptors' offsets.
    text=$(cat -- "$f") || die "hostfile '$f' cannot be read"
    hostfile_text[$f]=$text
    if [[ -n $text ]]; then exec {fd}<<<"$text"; else exec {fd}</dev/null; fi
  else
    exec {fd}<"$f" || die "hostfile '$f' cannot be read"
  fi
  while IFS= read -r -u "$fd" line || [[ -n $line ]]; do
    n=$((n + 1))
    [[ $line == *$'\r' ]] &&
      die "line $n of hostfile '$f' ends in a carriage return (CRLF line ends): convert the file with dos2unix or sed -i 's/\r\$//' '$f'"
    # A UTF-8 byte-order mark (a Windows editor's) is invisible in a message: "host name 'localhost'
    # has a character that host names do not have".
    ((n == 1)) && [[ $line == $'\xef\xbb\xbf'* ]] &&
      die "hostfile '$f' starts with a UTF-8 byte-order mark (saved by a Windows editor?): remove it with sed -i '1s/^\xEF\xBB\xBF//' '$f'"
    line=${line%%#*}
    line=${line//$'\t'/ }
    # Open MPI reads `slots = 2` as `slots=2` (the refusal said "'slots': slots must be a whole number").
    while [[ $line == *' ='* || $line == *'= '* ]]; do line=${line//' ='/=} line=${line//'= '/=}; done
    [[ $line == *[[:cntrl:]]* ]] && quote shown "$line" && die "line $n of hostfile '$f' has a control character: $shown"
    read -ra words <<<"$line"
    ((${#words[@]})) || continue
    check_host "${words[0]}" "line $n of hostfile '$f'"
    slots="" max=""
    for w in "${words[@]:1}"; do
      key=${w%%=*} val=${w#*=}
      quote shown "$w"
      case $key in
        slots | slot | count | cpu | cpus) ;;
        max_slots | max-slots) ;;
        *) continue ;;  # anything else is Open MPI's to judge
      esac
      [[ $w == *=* && $val =~ ^[0-9]{1,9}$ ]] ||
        die "line $n of hostfile '$f': $shown: $key must be a whole number"
      val=$((10#$val))
      ((val >= 1)) || die "line $n of hostfile '$f': $shown: a host needs at least 1 slot (leave the line out to use no slot of it)"
      # Twice on one line was mpirun's exit 1, "multiple definitions of the slot count".
      if [[ $key == max* ]]; then
        [[ -n $max ]] && die "line $n of hostfile '$f': $shown: the line gives max_slots twice"
        max=$val
      else
        [[ -n $slots ]] && die "line $n of hostfile '$f': $shown: the line gives slots twice"
        slots=$val
      fi
    done
    [[ -n $slots && -n $max ]] && ((max < slots)) &&
      die "line $n of hostfile '$f': max_slots=$max is below slots=$slots"
    host=${words[0]}
    [[ $host == localhost || $host == "$my_name" || $host == "$my_short" || $my_addrs == *" $host "* ]] &&
      host=" this host"
    if [[ -n ${first_line[$host]:-} ]]; then
      as="is on line ${first_line[$host]} already"
      [[ ${first_name[$host]} != "${words[0]}" ]] && as="is this host, as '${first_name[$host]}' on line ${first_line[$host]} is"
      [[ -n $slots$max || -n ${slotted[$host]} ]] &&
        die "line $n of hostfile '$f': host '${words[0]}' $as, with slots given: give each host one line, with all its slots"
    else
      first_line[$host]=$n
      first_name[$host]=${words[0]}
      slotted[$host]=$slots$max
    fi
    hosts+=("${words[0]}")
    [[ -n ${host_where[${words[0]}]:-} ]] || host_where[${words[0]}]="line $n of hostfile '$f'"
    hosts_here=$((hosts_here + 1))
  done
  exec {fd}<&-
  ((hosts_here)) ||
    die "hostfile '$f' names no host (its $n lines are blank or comments): mpirun would find no node to run on"
}

# What the command line says: the agent, whether checkpoints are on (dptrain's flags), and (below,
# with the rank count and the programs) the hosts.
# host_where: where each host was first written (a hostfile's line, --host), for the messages.
declare -A host_where=()
# hostfile_at: the indices in args of the hostfiles' names (mpirun's options' values).
np=1 hosts=() hostfiles=() hostfile_at=() ckpt_every="" rsh_args_given=0 agent_spec=${OMPI_MCA_plm_rsh_agent:-ssh}
[[ ${OMPI_MCA_orte_default_hostfile:-none} != none ]] && hostfiles+=("$OMPI_MCA_orte_default_hostfile")
args=("$@")
# --mca anywhere: mpirun (4.1) reads it after the program too.
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} v=${args[i + 1]:-}
  case $a in
    --checkpoint-every | --checkpoint-every=*) ckpt_every=1 ;;
    --mca | -mca)
      case $v in
        plm_rsh_args) rsh_args_given=1 ;;
        plm_rsh_agent | orte_rsh_agent) agent_spec=${args[i + 2]:-} ;;
        orte_default_hostfile)
          [[ ${args[i + 2]:-none} != none ]] && hostfiles+=("${args[i + 2]}") && hostfile_at+=($((i + 2))) ;;
      esac ;;
  esac
done
[[ -n ${OMPI_MCA_plm_rsh_args:-} ]] && rsh_args_given=1
# host_option OPTION VALUE: notes the hosts that one of mpirun's own options names. Only mpirun's
# options, before the program: mpirun reads no --host or --hostfile after it, and the program's own
# arguments (dptrain --save -H, another program's --host) taken for hosts refused the launch ("-H
# needs a value") or had their value checked, and tried, as a host.
host_option() {
  case $1 in
    --host | -host | -H) host_list "$1" "$2" ;;
    --hostfile | -hostfile | --machinefile | -machinefile | --default-hostfile | -default-hostfile)
      [[ -n $2 ]] || die "$1 needs a file"
      hostfiles+=("$2") ;;
  esac
}

# ---- the program and the rank count of each app context, checked before mpirun starts ----
# mpirun reports a program it cannot start (missing, a directory, not executable) with exit 131 or
# 132, which reads as death by SIGQUIT or SIGILL, and runs `-np 0` at one rank per slot. So the
# launcher finds each app context's program (`-np 1 a : -np 1 b` has two) itself: the first word
# that is neither an option nor an option's value. Open MPI 4.1's options that take a value
# (`mpirun --help all`: <arg0>); --mca and --gmca take two; any other option takes none.
mpirun_value_opts=" -am --app --bind-to -c -np --np -n --n -cf --cartofile -cpu-list --cpu-list -cpu-set
  --cpu-set -cpus-per-proc --cpus-per-proc -cpus-per-rank --cpus-per-rank -debugger --debugger
  -default-hostfile --default-hostfile -H -host --host -hnp --hnp -hostfile --hostfile -launch-agent
  --launch-agent -machinefile --machinefile --map-by -max-restarts --max-restarts -max-vm-size
  --max-vm-size -N -npernode --npernode -npersocket --npersocket -ompi-server --ompi-server
  -output-filename --output-filename -path --path -personality --personality --ppr --prefix
  --preload-files --rank-by -report-events --report-events -report-pid --report-pid -report-uri
  --report-uri -rf --rankfile -stdin --stdin -timeout --timeout -tune -wd --wd -wdir --wdir -x
  -xml-file --xml-file -xterm --xterm "
mpirun_value_opts=${mpirun_value_opts//$'\n'/ }
# check_program NAME SEARCH WDIR: NAME runs here: a file that is executable and not a directory; a
# name without '/' is looked up in SEARCH (mpirun's --path, then PATH), as mpirun does. Rank 0 runs
# on this host (docs/USAGE.md), so the program must be here too. A relative path is mpirun's from
# the context's working directory WDIR (--wdir, -wd; "" for this one): checked from here, `--wdir
# run ../build/dptrain` was refused ("no such file") where mpirun runs it, and `--wdir run
# build/dptrain` passed, for mpirun to fail with exit 132, "could not access or execute".
check_program() {
  local p=$1 search=$2 wdir=$3 shown found where=""
  quote shown "$p"
  [[ -n $p ]] || die "the program is an empty word"
  if [[ -n $wdir ]]; then
    quote where "$wdir"
    [[ -d $wdir ]] || die "--wdir $where: no such directory (mpirun starts the program there)"
    where=" (from --wdir $where)"
  fi
  if [[ $p != */* ]]; then
    found=$(PATH=$search type -P -- "$p") ||
      die "program $shown: no such command in the PATH$([[ $search != "$PATH" ]] && echo " or in --path")"
    p=$found where=""
  elif [[ $p != /* && -n $wdir ]]; then
    p=$wdir/$p
  else
    where=""
  fi
  [[ -e $p ]] || die "program $shown$where: no such file"
  [[ -d $p ]] && die "program $shown$where is a directory, not a program"
  [[ -f $p && -x $p ]] || die "program $shown$where is not executable (chmod +x?)"
  return 0
}
total_np=0 app_file="" search=$PATH
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} v=${args[i + 1]:-} ctx_np="" ctx_hostfile="" ctx_wdir=""
  # One app context: its options, then its program; its arguments run to a lone ':'.
  while [[ $a == -* ]]; do
    host_option "$a" "$v"
    case $a in
      --hostfile | -hostfile | --machinefile | -machinefile | --default-hostfile | -default-hostfile)
        hostfile_at+=($((i + 1))) ;;
    esac
    case $a in
      # mpirun takes one per app context: a second was its exit 1 ("More than one hostfile was
      # passed for a single application context"), naming neither file.
      --hostfile | -hostfile | --machinefile | -machinefile)
        if [[ -n $ctx_hostfile ]]; then
          quote shown "$v"
          die "$a $shown: this app context has $ctx_hostfile already, and mpirun takes one hostfile per app context: put all the hosts in one file (--default-hostfile may give another, for every context)"
        fi
        quote shown "$v"
        ctx_hostfile="$a $shown" ;;
      -np | -n | --np | --n | -c)
        ctx_np=$v
        [[ $v =~ ^[0-9]{1,6}$ ]] && ((10#$v >= 1)) ||
          die "$a '$v': the number of ranks must be a whole number, at least 1" ;;
      --app) app_file=$v ;;
      # Each context has its own (mpirun gives one context's to no other).
      -wd | --wd | -wdir | --wdir) ctx_wdir=$v ;;
      -path | --path) search=$v:$PATH ;; # searched before PATH
    esac
    if [[ $a == --mca || $a == -mca || $a == --gmca || $a == -gmca ]]; then
      i=$((i + 3))
    elif [[ $a != *=* && $mpirun_value_opts == *" $a "* ]]; then
      i=$((i + 2))
    else
      i=$((i + 1))
    fi
    a=${args[i]:-} v=${args[i + 1]:-}
  done
  [[ -n $ctx_np ]] && total_np=$((total_np + 10#$ctx_np))
  # --app: the programs are in the appfile, and mpirun ignores the rest of the command line.
  [[ -n $app_file ]] && break
  ((i < ${#args[@]})) || die "no program to run: usage: $me [--max-restarts N] [--ssh-timeout S] -np N program [args...]"
  check_program "$a" "$search" "$ctx_wdir"
  while ((i + 1 < ${#args[@]})) && [[ ${args[i + 1]} != : ]]; do i=$((i + 1)); done
  i=$((i + 1)) # the ':' that starts the next context, if any
done
((total_np > 0)) && np=$total_np
# mpirun itself: without it on PATH the launch ended with bash's "mpirun: command not found",
# exit 127, after the checks and relays had been set up (and 127 reads as a job that failed).
command -v mpirun >/dev/null ||
  die "mpirun not found in the PATH ($PATH): install Open MPI (apt-get install openmpi-bin, or bash launch/deps.sh) or add the directory that holds mpirun to PATH"
# This host's names and addresses: mpirun runs on it without ssh (and read_hostfile's duplicates).
my_addrs=" 127.0.0.1 ::1 $(hostname -I 2>/dev/null) " my_name=$(hostname) my_short=$(hostname -s)
for f in "${hostfiles[@]}"; do read_hostfile "$f"; done

extra=()
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
# The cores this process may run on: nproc counts its affinity mask (sched_getaffinity: taskset, a
# container's cpuset, a batch system's cgroup), as dptrain's pre-flight does, not the online CPUs.
# But nproc answers OMP_NUM_THREADS (and OMP_THREAD_LIMIT) when set, so OMP_NUM_THREADS=8 on 2
# cores left out --oversubscribe and mpirun refused -np 4 ("not enough slots").
[[ $np =~ ^[0-9]+$ ]] && ((np > $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc))) &&
  extra+=(--oversubscribe)
# Ranks' stderr is a pipe under mpirun: tell them whether the user's terminal is there.
[[ -t 2 ]] && extra+=(-x DPT_PROGRESS=1)
# The ranks' stdout and stderr are pipes to the relays below, which copy them to this script's own:
# rank 0 cannot see that `--metrics run.log > run.log` writes into the log (truncated, then records
# and log lines over each other). It is told which files they are (device:inode, on this host) and
# refuses such an output by name. /proc/$$: the script's own streams, not the substitution's pipe.
stream_id() { [[ -f /proc/$$/fd/$1 ]] && stat -L -c '%d:%i' "/proc/$$/fd/$1" 2>/dev/null || echo -; }
extra+=(-x "DPT_LAUNCHER_STREAMS=$my_name $(stream_id 1) $(stream_id 2)")
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}

# mpirun makes its session directory, with PMIx's shared-memory store (about 9 MiB: a file system
# with 8 MiB free failed 2 ranks), in the first of TMPDIR, TEMP and TMP that is set
# (OMPI_MCA_orte_tmpdir_base wins over them), creating what is missing of the path. One that cannot
# be made there (TEMP or TMP under a file, or in a directory that cannot be written) or a full file
# system failed with exit 1 and pages of Open MPI's text ("orte_session_dir failed", "PMIX ERROR:
# OUT-OF-RESOURCE") that name no variable. The nearest part of the path that exists decides.
session_kib=9216 # the room it needs: the singleton's kSessionKiB (src/comm/communicator.cc) too
session_var=""
for v in OMPI_MCA_orte_tmpdir_base TMPDIR TEMP TMP; do [[ -n ${!v+set} ]] && session_var=$v && break; done
if [[ -n $session_var ]]; then
  session_dir=${!session_var} d=${!session_var:-/}
  # A symbolic link to nothing cannot be made into a directory (Open MPI: "File exists", exit 1).
  while [[ ! -e $d && ! -L $d ]]; do
    if [[ $d == */* ]]; then d=${d%/*} d=${d:-/}; else d=.; fi
  done
  quote shown "$session_dir"
  why=""
  if [[ ! -e $d ]]; then
    why="$d is a symbolic link to $(readlink -- "$d"), which does not exist"
  elif [[ ! -d $d ]]; then
    why="$d is not a directory"
  elif [[ ! -w $d || ! -x $d ]]; then
    why="$d is not writable"
  else
    free_kib=$(df -Pk -- "$d" 2>/dev/null | awk 'NR == 2 { print $4 }')
    [[ $free_kib =~ ^[0-9]+$ ]] && ((free_kib < session_kib)) &&
      why="its file system has $free_kib KiB free, and mpirun's session directory needs about $((session_kib / 1024)) MiB"
  fi
  [[ -z $why ]] ||
    die "$session_var=$shown: $why: mpirun makes its session directory there; unset $session_var or point it at a directory you can write, with room"
fi

# A private directory (mktemp -d: mode 700) for this launch, removed on exit: the ssh probes'
# output, the checkpoint record and the relays' FIFOs.
work=$(mktemp -d "${TMPDIR:-/tmp}/dptrain-launch.XXXXXX") ||
  die "cannot create a directory in ${TMPDIR:-/tmp}${TMPDIR:+ (TMPDIR, where mpirun makes its session directory too): unset TMPDIR or point it at a directory you can write}"
trap 'rm -rf -- "$work"' EXIT
# Absolute: rank 0 opens the checkpoint record in it from its own working directory, which --wdir
# moves (a relative TMPDIR gave a record rank 0 could not find, and no restart).
[[ $work == /* ]] || work=$PWD/$work
# mpirun reads a copy of each hostfile that could be read only once (read_hostfile).
k=0
for f in "${!hostfile_text[@]}"; do
  k=$((k + 1))
  printf '%s\n' "${hostfile_text[$f]}" >"$work/hostfile.$k" || die "cannot write $work/hostfile.$k"
  for i in "${hostfile_at[@]}"; do [[ ${args[i]} == "$f" ]] && args[i]=$work/hostfile.$k; done
  [[ ${OMPI_MCA_orte_default_hostfile:-} == "$f" ]] && export OMPI_MCA_orte_default_hostfile=$work/hostfile.$k
done

# ---- across hosts: the remote hosts answer, or the job does not start ----
# mpirun starts its daemons with this agent: ssh unless plm_rsh_agent (--mca or OMPI_MCA_) says
# otherwise, the first command found of a list such as "ssh : rsh", as Open MPI picks it.
agent=()
IFS=: read -ra agent_list <<<"$agent_spec"
for c in "${agent_list[@]}"; do
  read -ra words <<<"$c"
  ((${#words[@]})) && command -v "${words[0]}" >/dev/null && agent=("${words[@]}") && break
done
ssh_opts=(-o ConnectTimeout="$ssh_timeout" -o BatchMode=yes)
((rsh_args_given)) || extra+=(--mca plm_rsh_args "${ssh_opts[*]}")
# A host mpirun runs on without the agent, as Open MPI decides: this host's names, and addresses of
# its interfaces (127.0.0.2 is not one: mpirun uses ssh for it).
# This host's names and addresses are asked once, and the distinct host names left looked up in
# one getent call (an address not at all): five commands per hostfile line made a 10,000-line file
# take a minute, and one getent per name was still a process per host.
hosts_in_order=() lookup=()
declare -A seen_host=() addrs_of=()
for h in "${hosts[@]}"; do
  strip_slots h
  [[ -n ${seen_host[$h]:-} ]] && continue
  seen_host[$h]=1
  hosts_in_order+=("$h")
  # An address needs no lookup: it is one of this host's or it is not.
  [[ $h =~ ^[0-9.]+$ || $h == *:* ]] || lookup+=("$h")
done
if ((${#lookup[@]})); then
  # getent prints a line per address found, "ADDRESS NAME ALIASES...", not the name it was asked
  # (nothing for a name it cannot resolve): a line belongs to each name asked that it lists, or
  # that it lists with a domain added (node1 -> node1.cluster: a DNS search domain). Names compare
  # in lower case. A command substitution, not <(...): `wait -n` below would count that process.
  declare -A asked=()
  for h in "${lookup[@]}"; do asked[${h,,}]=1; done
  unclaimed=0
  while read -r addr names; do
    [[ -n $addr ]] || continue
    claimed=0
    for n in $names; do
      n=${n,,}
      for key in "$n" "${n%%.*}"; do
        [[ -n ${asked[$key]:-} ]] && addrs_of[$key]+=" $addr " && claimed=1
      done
    done
    ((claimed)) || unclaimed=1
  done <<<"$(getent hosts "${lookup[@]}" 2>/dev/null)"
  # A line no name claimed (a canonical name in another domain): the names left without an address
  # are asked one by one, as before the batch, rather than taken for unresolved.
  if ((unclaimed)); then
    for h in "${lookup[@]}"; do
      [[ -n ${addrs_of[${h,,}]:-} ]] ||
        addrs_of[${h,,}]=" $(getent hosts "$h" 2>/dev/null | cut -d' ' -f1 | tr '\n' ' ') "
    done
  fi
fi
is_local() {
  local h=$1 a
  [[ $h == localhost || $h == "$my_name" || $h == "$my_short" || $my_addrs == *" $h "* ]] && return 0
  for a in ${addrs_of[${h,,}]:-}; do
    [[ $my_addrs == *" $a "* ]] && return 0
  done
  return 1
}
remote=()
for h in "${hosts_in_order[@]}"; do is_local "$h" || remote+=("$h"); done
if ((${#remote[@]})); then
  ((${#agent[@]})) || die "'$agent_spec' not found: mpirun needs it to start ranks on ${remote[*]} (apt-get install openssh-client)"
  # 16 at a time (pdsh's fanout is 32), each bounded: ConnectTimeout covers the connection and
  # ssh's greeting, timeout(1) anything after it (a login that hangs). Hundreds of hosts at once
  # were hundreds of processes and ssh connections at once (sshd's MaxStartups refuses past 10
  # unauthenticated ones by default). The host after '--': never an option, whatever its name.
  fanout=16
  probes=$work/probes
  mkdir "$probes" || die "cannot create $probes"
  running=0
  for i in "${!remote[@]}"; do
    ((running < fanout)) || { wait -n; running=$((running - 1)); }
    (
      timeout -k 2 $((ssh_timeout + 5)) "${agent[@]}" "${ssh_opts[@]}" -- "${remote[i]}" true </dev/null >"$probes/$i.out" 2>&1
      echo $? >"$probes/$i.rc"
    ) &
    running=$((running + 1))
  done
  wait
  bad=0
  for i in "${!remote[@]}"; do
    rc=$(cat "$probes/$i.rc" 2>/dev/null)
    [[ $rc =~ ^[0-9]+$ ]] || rc=1  # a probe that wrote no status failed
    if ((rc != 0)); then
      why=$(tr '\n' ' ' <"$probes/$i.out")
      ((rc == 124)) && why="no answer within $((ssh_timeout + 5)) s"
      echo "$me: error: ${host_where[${remote[i]}]:+${host_where[${remote[i]}]}: }host '${remote[i]}' cannot be reached with '${agent[*]} ${ssh_opts[*]} -- ${remote[i]}' (exit $rc): ${why:-no message}" >&2
      bad=1
    fi
  done
  ((bad)) && die "not starting: mpirun would wait on the host(s) above. Check the name, the network and that ssh logs in without a password (BatchMode)."
fi

# ---- the job, run again after a failure when restarts are allowed ----
mkfifo -m 600 "$work/stdout" "$work/stderr" || die "cannot create FIFOs in $work"
# Whether a restart can help: the checkpoint record (launch/checkpoint_record.sh, shared with the
# Slurm script). Rank 0 must run on this host, as docs/USAGE.md advises: elsewhere the path does
# not exist and no failure is restarted.
# shellcheck source=launch/checkpoint_record.sh
source "$(dirname "${BASH_SOURCE[0]}")/checkpoint_record.sh" || die "cannot read launch/checkpoint_record.sh"
# mpirun's status, waited for through this script's traps (shared with the Slurm script, for srun).
# shellcheck source=launch/wait_status.sh
source "$(dirname "${BASH_SOURCE[0]}")/wait_status.sh" || die "cannot read launch/wait_status.sh"
record_start "$work/checkpoints" || die "cannot write $work/checkpoints"
((max_restarts > 0)) && extra+=(-x "DPT_CHECKPOINT_RECORD=$record_file")

# mpirun's stdout and stderr each go through a relay (launch/wait_status.sh), because mpirun aborts
# the whole job once its writes to a closed pipe have raised SIGPIPE more than 10 times ("mpirun:
# SIGPIPE detected on fd 13 - aborting"): `launch/mpirun.sh ... | grep -m1 'epoch 2/'` lost the
# rest of the run and its --save. SIGINT and SIGHUP reach mpirun through this script (as SIGUSR1),
# not through the relays, which pass the output of the ranks' last checkpoint.
relays=() # the relays' pids (wait_relays)
((max_restarts > 0)) && [[ -z $ckpt_every ]] &&
  echo "$me: warning: --max-restarts $max_restarts without --checkpoint-every: no checkpoint is written, so a failed job is not restarted" >&2

grace=10  # seconds: SIGTERM to SIGKILL, and mpirun's or its ranks' time to end (wait_mpirun)
got=0     # the signal this script received
got_name="" told=0 # its name; whether mpirun was told of it (tell_mpirun)
child=""  # mpirun's pid
kill_at="" # when set: SIGKILL to mpirun's process group at this $SECONDS (wait_mpirun)
# A job on this host alone with nothing running has no step to finish and no checkpoint to
# write: mpirun stuck before starting its ranks (NP=100000 on one host: out of pipes, printing
# ORTE_ERROR_LOG) ignores SIGUSR1, and a single SIGTERM (`timeout` without -k) left it, and this
# script, running for ever. Such a job is ended at once: SIGTERM, then SIGKILL to mpirun's process
# group $grace s later. On this host alone: no Slurm allocation, no appfile (its hosts are not read
# here), and every host named (--host, hostfiles; none at all) one of this host's names or addresses
# (is_local, as mpirun takes them: with a hostfile of `localhost slots=2` the one signal went to the
# stuck mpirun as SIGUSR1, and only a second ended it). Nothing running: mpirun has no live child,
# neither a rank here nor the agent (ssh) of a daemon elsewhere; a name that mpirun takes for
# another host where is_local does not (::1) has such a child, and the job its checkpoint.
unstarted_local_job() {
  [[ -n $child && -z ${SLURM_JOB_ID:-} && -z $app_file ]] && ((${#remote[@]} == 0)) || return 1
  ! mpirun_has_child
}
# Whether mpirun ($child) has a live child process (children_of, wait_status.sh: a zombie has ended;
# out of pipes, mpirun has dozens of ranks that ran and ended).
mpirun_has_child() {
  local children
  children_of "$child"
  ((${#children[@]}))
}
on_signal() {
  local name=$1 num=$2
  if ((got)); then
    # An mpirun stuck before or while starting ranks on other hosts ignores SIGUSR1 and SIGTERM
    # alike, and only the unstarted local job below had the SIGKILL after them: a job across hosts
    # stayed stuck after any number of signals.
    local then=""
    if [[ -n $child && -z $kill_at ]]; then
      kill_at=$((SECONDS + grace))
      then=" (SIGKILL to mpirun in $grace s if it is still there)"
    fi
    echo "$me: second $name: killing the job without waiting for the checkpoint$then" >&2
    [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
    return
  fi
  got=$num got_name=$name
  # Before mpirun's pid is known (the signal came between its fork and `child=$!`), the job loop
  # tells it once it is: told by nobody, such an mpirun ran the whole job.
  [[ -n $child ]] && tell_mpirun
}
# end_mpirun WHY: says WHY mpirun ($child) is ended, sends it SIGTERM, and has wait_mpirun send
# SIGKILL to its process group $grace s later (kill_at).
end_mpirun() {
  echo "$me: $1: ending mpirun (SIGKILL in $grace s if it is still there)" >&2
  note_ranks # its agents, which may outlive it
  kill -TERM "$child" 2>/dev/null
  kill_at=$((SECONDS + grace))
}
# Passes the first signal on to mpirun ($child): ended when nothing runs (unstarted_local_job),
# SIGUSR1 to every rank otherwise.
tell_mpirun() {
  told=1
  if unstarted_local_job; then
    end_mpirun "$got_name: no rank of the job is running"
    return
  fi
  echo "$me: $got_name: every rank finishes its step, writes the checkpoint (if --checkpoint-every is on) and stops; $got_name again kills at once" >&2
  kill -USR1 "$child" 2>/dev/null
}
trap 'on_signal SIGHUP 1' HUP
trap 'on_signal SIGINT 2' INT
trap 'on_signal SIGTERM 15' TERM

# ---- after mpirun starts: the job ends in bounded time, and only once its ranks here have ----
# mpirun can outlive its job: after an MPI_Abort it waits until every daemon confirms, and a daemon
# behind a link that is down answers only when TCP gives up (mpirun exited 954 s after the link
# went down, with --timeout 8, while the ranks had ended 10 s after). It can also return before its
# ranks here have ended: Open MPI counts a rank it SIGKILLs as ended at once, without waiting for
# it (a rank still tearing down its memory or GPU lives on), and an mpirun that crashes (it
# segfaulted in its abort path) leaves its ranks running. So this script notes mpirun's ranks on
# this host (its children whose environment names a world rank; its ssh children have none) and
#  - ends mpirun's process group (mpirun and its ssh children) once mpirun has outlived them by
#    $grace s; ranks on other hosts end by themselves (--timeout, then an MPI_Abort that dptrain
#    bounds), their daemons when they lose mpirun. The job's exit is then 3 (a failure);
#  - after mpirun, waits for them: $grace s at most, then SIGKILL to each one's process group.
# mpirun's other children here, the agents (ssh, or srun) that started its daemons on other hosts,
# are noted too: Open MPI puts each in a process group of its own, so an end of mpirun's group
# missed them, and an ssh to a host behind a link that is down stayed (and held the output relays
# open) until TCP gave up, after this script had returned. They are killed with their process
# groups: at once when this script ended mpirun, and $grace s after mpirun ended by itself.
# A job with no rank on this host is not bounded this way. /proc is read directly, without
# procps (minimal systems lack it), and without a subshell per look.
ranks=() # mpirun's ranks on this host, as "pid:start time"
agents=() # its other children (ssh, srun), likewise
# Sets start to PID's start time (field 22 of /proc/PID/stat); fails when PID has ended or is a
# zombie. With its pid it names a rank, so that a pid reused after the rank ended is not taken for it.
start_of() {
  local stat fields
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  read -ra fields <<<"${stat##*) }" # the fields after the command name, which may hold spaces
  [[ ${fields[0]} != Z ]] && start=${fields[19]}
}
# Adds mpirun's children to ranks or agents. A child seen first between its fork and its exec
# (without a rank's environment yet) moves from agents to ranks once it is a rank.
note_ranks() {
  local p start children
  children_of "$child"
  for p in "${children[@]}"; do
    [[ " ${ranks[*]} " == *" $p:"* ]] && continue
    start_of "$p" || continue
    if grep -qz '^OMPI_COMM_WORLD_RANK=' "/proc/$p/environ" 2>/dev/null; then
      ranks+=("$p:$start")
      agents=("${agents[@]/#$p:*/}")
    elif [[ " ${agents[*]} " != *" $p:"* ]]; then
      agents+=("$p:$start")
    fi
  done
}
# "ssh[1234] srun[1240]": the command names and pids of the pids given.
names_of() {
  local p comm out=()
  for p; do
    comm="?"
    { read -r comm <"/proc/$p/comm"; } 2>/dev/null
    out+=("${comm}[$p]")
  done
  echo "${out[*]}"
}
# Sets left to the pids of the noted ranks still running, strays to the agents'.
find_left() {
  local r start
  left=() strays=()
  for r in "${ranks[@]}"; do
    start_of "${r%%:*}" && [[ $start == "${r#*:}" ]] && left+=("${r%%:*}")
  done
  for r in "${agents[@]}"; do
    [[ -n $r ]] && start_of "${r%%:*}" && [[ $start == "${r#*:}" ]] && strays+=("${r%%:*}")
  done
  return 0
}
# kill_groups PID...: SIGKILL to each PID's process group, or to PID alone where it leads none.
# mpirun leads its own (set -m below), and Open MPI makes each rank and each agent the leader of one
# (their children go with them).
kill_groups() {
  local p
  for p; do kill -KILL -- -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  return 0
}
# Kills mpirun ($child) and its process group, after noting its ranks and agents (which are not in
# that group), and reaps it without the shell's "Killed" notice, which is for crashes, not for a
# kill this script sent.
kill_mpirun() {
  note_ranks
  kill_groups "$child"
  wait_status "$child" quiet
  ended=1
}
# Waits for mpirun ($child) to end, bounded as above, then for its ranks here; sets rc.
wait_mpirun() {
  local alone="" seen="" left=() strays=() idle="" ended=0
  ranks=() agents=() rc=""
  while kill -0 "$child" 2>/dev/null; do
    if [[ -n $kill_at ]] && ((SECONDS >= kill_at)); then
      echo "$me: mpirun did not end $grace s after SIGTERM: killing it" >&2
      kill_mpirun
      break
    fi
    # A signal that came while ranks ran (or were being started) went to mpirun as SIGUSR1. On this
    # host alone, once mpirun has had no live child for 3 s no rank is left to stop, and an mpirun
    # that stays is stuck: out of pipes, it starts dozens of ranks that end at once, then waits for
    # ever, deaf to SIGUSR1, and a signal in those first seconds took a second one to end it. It
    # is ended as an unstarted job is. (An mpirun whose ranks have ended exits in milliseconds.)
    if ((got)) && [[ -z $kill_at ]]; then
      if unstarted_local_job; then
        idle=${idle:-$SECONDS}
        if ((SECONDS - idle >= 3)); then
          end_mpirun "no rank of the job is running any more, and mpirun has not ended"
        fi
      else
        idle=""
      fi
    fi
    # Open MPI starts a job's ranks on a host together: looking for 3 s after the first is seen
    # finds them all, and spares a scan of /proc every second of a long run.
    if [[ -z $seen ]] || ((SECONDS - seen <= 3)); then note_ranks; fi
    ((${#ranks[@]})) && seen=${seen:-$SECONDS}
    find_left
    if ((${#ranks[@]} && !${#left[@]})); then
      alone=${alone:-$SECONDS}
      if ((SECONDS - alone >= grace)); then
        echo "$me: mpirun is still running $grace s after the job's ranks on this host ended (waiting for a host it cannot reach?): ending it; exit 3" >&2
        # SIGKILL: to SIGTERM, an mpirun in its abort path answers with a segfault and a stack
        # trace.
        kill_mpirun
        rc=3
        break
      fi
    else
      alone=""
    fi
    sleep 1 & # waited in the background: a trapped signal ends the wait at once
    wait "$!"
  done
  [[ -n $rc ]] || wait_status "$child"
  # Then the ranks here have $grace s to end, and the agents as long, but none after an mpirun this
  # script ended (SIGTERM, kill_at; or SIGKILL), which has left them nothing to do. Whatever is still
  # there at its deadline is killed; what outlives its SIGKILL by 5 s is named, and the wait ends.
  local rank_by=$((SECONDS + grace)) agent_by=$((SECONDS + grace)) agents_now="" killed_at=""
  if ((ended)) || [[ -n $kill_at ]]; then agent_by=$SECONDS agents_now=1; fi
  while find_left; ((${#left[@]} + ${#strays[@]})); do
    if ((${#left[@]} && rank_by >= 0 && SECONDS >= rank_by)); then
      echo "$me: rank process(es) ${left[*]} still running $grace s after mpirun ended: killing them" >&2
      kill_groups "${left[@]}"
      rank_by=-1 killed_at=$SECONDS
    fi
    if ((${#strays[@]} && agent_by >= 0 && SECONDS >= agent_by)); then
      if [[ -n $agents_now ]]; then
        echo "$me: ending what mpirun left running: $(names_of "${strays[@]}") (an agent to a host that does not answer?)" >&2
      else
        echo "$me: mpirun's agent(s) $(names_of "${strays[@]}") still running $grace s after mpirun ended (a host that does not answer?): killing them" >&2
      fi
      kill_groups "${strays[@]}"
      agent_by=-1 killed_at=$SECONDS
    fi
    if [[ -n $killed_at ]] && ((SECONDS >= killed_at + 5)) &&
      ! ((${#left[@]} && rank_by >= 0 || ${#strays[@]} && agent_by >= 0)); then
      echo "$me: warning: process(es) ${left[*]} ${strays[*]} of the job still there after SIGKILL" >&2
      break
    fi
    sleep 0.1 &
    wait "$!"
  done
}

# mpirun in its own process group (job control on), so that a terminal's Ctrl-C reaches this script
# only, and not mpirun's kill-after-1-s. Its stdin is not the terminal: a background process group
# that read it would be stopped.
set -m
attempt=0
cmd=("${args[@]}")
while :; do
  # A signal before this attempt's mpirun (its relays would wait for it): nothing runs to be stopped.
  if ((got)); then
    echo "$me: $got_name before mpirun started: not starting it; exit $((128 + got))" >&2
    exit $((128 + got))
  fi
  record_mark
  relay stdout <"$work/stdout" &
  relays=($!)
  relay stderr <"$work/stderr" >&2 &
  relays+=($!)
  mpirun "${extra[@]}" --bind-to none "${cmd[@]}" </dev/null >"$work/stdout" 2>"$work/stderr" &
  child=$!
  ((got && !told)) && tell_mpirun
  wait_mpirun
  child=""
  wait_relays
  if ((got)); then
    echo "$me: stopped by signal $got (the job exited with $rc); exit $((128 + got))" >&2
    exit $((128 + got))
  fi
  # A job that succeeded while its output could not be written (a full disk under `> log`): its
  # checkpoints and --save are its own files, but the log is not whole, and 0 would hide that.
  if ((rc == 0 && output_lost)); then
    echo "$me: the job ended with exit 0, but its output could not all be written (above); exit 74" >&2 2>/dev/null
    exit 74
  fi
  # Done, refused input (2) or a stop asked of the ranks themselves (128 + HUP, INT, USR1, TERM):
  # a restart would not help.
  case $rc in 0 | 2 | 129 | 130 | 138 | 143) exit "$rc" ;; esac
  ((attempt < max_restarts)) || {
    ((max_restarts)) && echo "$me: the job failed with exit $rc; no restarts left ($max_restarts used)" >&2
    exit "$rc"
  }
  if ! record_grew; then
    echo "$me: the job failed with exit $rc without writing a checkpoint since it started: not restarting" >&2
    exit "$rc"
  fi
  attempt=$((attempt + 1))
  echo "$me: the job failed with exit $rc after writing a checkpoint (the newest: $(record_newest)); restart $attempt of $max_restarts with --resume auto" >&2
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
