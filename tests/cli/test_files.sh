#!/usr/bin/env bash
# Files that cannot be turned against the operator (issue 23): outputs are written through
# unpredictable O_EXCL|O_NOFOLLOW temporaries (a planted symlink is not written through), keep the
# mode of the file they replace, follow a symlink only to a regular file and refuse FIFOs and
# devices at pre-flight; inputs that are FIFOs fail in seconds instead of hanging any rank; a reader
# that closes the pipe does not end the run or lose --save; a --save that fails says "--save"; a
# second run given a running one's output is refused, and a killed run's lock refuses nothing.
# Every check is separate and bounded by `timeout`, so an old build fails them instead of hanging.
# Usage: test_files.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
launcher=$(cd "$(dirname "$0")/../../launch" && pwd)/mpirun.sh
data=/usr/share/datasets/fashion-mnist
umask 022  # a new file is then 0644, so a kept 0600 cannot come from the umask
cd "$tmp" || exit 1
mounted=""
# A build that hangs on a FIFO leaves ranks behind when its launcher is killed: end the processes
# whose command line names this run's own directory (by pid), unmount the test tmpfs, clean up.
reap() {
  local p
  for p in /proc/[0-9]*; do
    [[ ${p#/proc/} == "$$" ]] && continue
    tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -qF -- "$tmp/" && kill -9 "${p#/proc/}" 2>/dev/null
  done
}
trap 'reap; [[ -n $mounted ]] && umount "$mounted"; rm -rf "$tmp"' EXIT

# The smallest real run: two LeNet steps, no evaluation, one thread.
small=(--model lenet --epochs 1 --max-steps 2 --eval-every 0 --threads 1 --batch-size 64 --progress off)
ok() { echo "ok: $*"; }
# run LOG SECONDS cmd...: a bounded run, its output in LOG, its exit code returned.
run() {
  local log=$1 secs=$2
  shift 2
  timeout -k 2 "$secs" "$@" > "$log" 2>&1
}
# A --save or checkpoint file is whole: the safetensors header parses and the data fills the file.
loadable() {
  python3 - "$1" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
end = max(v["data_offsets"][1] for k, v in head.items() if k != "__metadata__")
sys.exit(0 if end > 0 and 8 + n + end == len(raw) else 1)
PY
}
first() { grep -m1 -F -- "$1" "$2" | cut -c1-100; }

# ---- 1. A symlink planted at the temporary name is not written through -----------------------
# --report and --trace used "<file>.tmp".
mkdir -p s1 && echo "victim: must not change" > s1/victim && cp s1/victim s1/victim.orig
ln -s "$tmp/s1/victim" s1/r.svg.tmp
ln -s "$tmp/s1/victim" s1/t.json.tmp
run s1/out 60 "$bin" "${small[@]}" --report "$tmp/s1/r.svg" --trace "$tmp/s1/t.json" --trace-steps 1:2
rc=$?
if [[ $rc -ne 0 ]]; then
  fail "1 symlinks (--report/--trace): the run failed (exit $rc)"; tail -3 s1/out
elif ! cmp -s s1/victim s1/victim.orig; then
  fail "1 --report/--trace wrote through a symlink planted at <file>.tmp: the victim now starts" \
       "'$(head -c 40 s1/victim)'"
elif ! grep -q '<svg' s1/r.svg 2>/dev/null || ! grep -q traceEvents s1/t.json 2>/dev/null; then
  fail "1 --report/--trace: the report or the trace was not written"
else
  ok "1 --report/--trace do not write through a symlink planted at <file>.tmp"
fi

# Checkpoints and --save used "<path>.tmp.<pid>". exec keeps the pid: the shell that plants the
# links at its own pid ($$) becomes the dptrain process that writes those files.
mkdir -p s1b && echo "victim: must not change" > s1b/victim && cp s1b/victim s1b/victim.orig
run s1b/out 60 bash -c 'for f in "$2/m.st" "$2/c.st"; do ln -s "$2/victim" "$f.tmp.$$"; done
                        exec "$1" "${@:3}"' _ "$bin" "$tmp/s1b" "${small[@]}" --save "$tmp/s1b/m.st" \
  --checkpoint-every 1 --checkpoint-path "$tmp/s1b/c.st"
rc=$?
if [[ $rc -ne 0 ]]; then
  fail "1 symlinks (--save/checkpoint): the run failed (exit $rc)"; tail -3 s1b/out
elif ! cmp -s s1b/victim s1b/victim.orig; then
  fail "1 --save/checkpoint wrote through a symlink planted at <file>.tmp.<pid>"
elif ! loadable s1b/m.st || ! loadable s1b/c.st; then
  fail "1 --save/checkpoint: the files were not written whole"
else
  ok "1 --save and checkpoints do not write through a symlink planted at <file>.tmp.<pid>"
fi

# ---- 2. Outputs that are not regular files are refused at pre-flight, named --------------------
for flag in --report --trace --save --checkpoint-path; do
  d=s2${flag#--} && mkdir -p "$d" && mkfifo "$d/out"
  extra=()
  [[ $flag == --checkpoint-path ]] && extra=(--checkpoint-every 1)
  [[ $flag == --trace ]] && extra=(--trace-steps 1:2)
  run "$d/log" 15 "$bin" "${small[@]}" "${extra[@]}" "$flag" "$tmp/$d/out"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag" "$d/log"; then
    fail "2 $flag FIFO: exit $rc (want 2), message naming $flag:"; tail -3 "$d/log"
  elif [[ ! -p $d/out ]]; then
    fail "2 $flag FIFO: the FIFO was replaced"
  else
    ok "2 $flag FIFO refused: $(first "$flag" "$d/log")"
  fi
done
# A character device: a null device made here (the real /dev/null is never put at risk).
mkdir -p s2dev
if [[ $(id -u) -ne 0 ]] || ! mknod s2dev/null c 1 3 2>/dev/null; then
  echo "skip: 2 --save to a character device: cannot mknod here (needs root and CAP_MKNOD)"
else
  run s2dev/log 15 "$bin" "${small[@]}" --save "$tmp/s2dev/null"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "--save" s2dev/log; then
    fail "2 --save to a character device: exit $rc (want 2), message naming --save:"; tail -3 s2dev/log
  elif [[ ! -c s2dev/null ]]; then
    fail "2 --save to a character device: the node was replaced by a $(stat -c %F s2dev/null)"
  else
    ok "2 --save to a character device refused, the node kept"
  fi
fi
# A symlink to a regular file is followed: the link stays, the file it names gets the content.
mkdir -p s2link && : > s2link/real.st && ln -s real.st s2link/link.st
run s2link/log 60 "$bin" "${small[@]}" --save "$tmp/s2link/link.st"
rc=$?
if [[ $rc -ne 0 ]]; then
  fail "2 --save through a symlink: exit $rc"; tail -3 s2link/log
elif [[ ! -L s2link/link.st || $(readlink s2link/link.st) != real.st ]]; then
  fail "2 --save through a symlink: the link was replaced by a $(stat -c %F s2link/link.st)"
elif ! loadable s2link/real.st; then
  fail "2 --save through a symlink: the file it names was not written"
else
  ok "2 --save through a symlink writes the file it names; the link stays"
fi

# /dev/stdout into a pipe (`--report /dev/stdout | head`) is a link to a FIFO, refused like one:
# the message said "a symlink to nothing that exists" (realpath cannot resolve "pipe:[N]").
mkdir -p s2pipe
timeout -k 2 15 "$bin" "${small[@]}" --report /dev/stdout 2> s2pipe/log | cat > /dev/null
rc=${PIPESTATUS[0]}
if [[ $rc -ne 2 ]] || ! grep -qF -- "--report /dev/stdout is a symlink to a FIFO" s2pipe/log; then
  fail "2 --report /dev/stdout into a pipe: exit $rc (want 2), message naming the FIFO:"; tail -3 s2pipe/log
else
  ok "2 --report /dev/stdout into a pipe refused: $(first --report s2pipe/log)"
fi

# ---- 3. A replaced file keeps its mode ---------------------------------------------------------
mkdir -p s3 && for f in r.svg c.st m.st; do echo old > "s3/$f"; chmod 0600 "s3/$f"; done
run s3/log 60 "$bin" "${small[@]}" --report "$tmp/s3/r.svg" --checkpoint-every 1 \
  --checkpoint-path "$tmp/s3/c.st" --save "$tmp/s3/m.st"
rc=$?
if [[ $rc -ne 0 ]]; then
  fail "3 modes: the run failed (exit $rc)"; tail -3 s3/log
else
  for f in r.svg c.st m.st; do
    if echo old | cmp -s - "s3/$f"; then
      fail "3 $f was not rewritten"
    elif [[ $(stat -c %a "s3/$f") != 600 ]]; then
      fail "3 $f: mode 0600 became 0$(stat -c %a "s3/$f")"
    else
      ok "3 $f rewritten and still 0600"
    fi
  done
fi

# ---- 5. Inputs that are FIFOs fail in seconds, named, at 1 and 2 ranks ---------------------------
mkdir -p s5/data
for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz train-labels-idx1-ubyte.gz; do
  ln -s "$data/$f" "s5/data/$f"
done
mkfifo s5/data/train-images-idx3-ubyte.gz s5/resume.st s5/metrics.jsonl
# flag|argument|the file the message must name
inputs=("--data|$tmp/s5/data|$tmp/s5/data/train-images-idx3-ubyte.gz"
        "--resume|$tmp/s5/resume.st|$tmp/s5/resume.st"
        "--metrics|$tmp/s5/metrics.jsonl|$tmp/s5/metrics.jsonl")
for np in 1 2; do
  launch=("$bin") && [[ $np -eq 2 ]] && launch=(bash "$launcher" -np 2 "$bin")
  for spec in "${inputs[@]}"; do
    IFS='|' read -r flag arg file <<< "$spec"
    start=$SECONDS
    run s5/log 15 "${launch[@]}" "${small[@]}" "$flag" "$arg"
    rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      fail "5 $flag FIFO at $np rank(s): still running after 15 s"; reap
    elif [[ $rc -ne 2 ]] || ! grep -qF -- "$file" s5/log; then
      fail "5 $flag FIFO at $np rank(s): exit $rc (want 2), message naming $file:"; tail -3 s5/log
    else
      ok "5 $flag FIFO at $np rank(s): exit 2 in $((SECONDS - start)) s, named"
    fi
  done
done

# ---- 6. A reader that closes the pipe does not end the run --------------------------------------
mkdir -p s6
timeout -k 2 60 "$bin" "${small[@]}" --epochs 2 --save "$tmp/s6/m1.st" 2> s6/err1 | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
warned=$(grep -c 'stdout is gone' s6/err1)
if [[ $rc -ne 0 ]]; then
  fail "6 singleton | head -c 1: exit $rc (141: killed by SIGPIPE)"; tail -3 s6/err1
elif ! loadable s6/m1.st; then
  fail "6 singleton | head -c 1: --save was not written"
elif [[ $warned -ne 1 ]]; then
  fail "6 singleton | head -c 1: $warned 'stdout is gone' warnings on stderr (want 1)"
else
  ok "6 singleton | head -c 1: exit 0, --save written, one warning"
fi
# evaluate's reader gone: the same warning, of the run (it said "training goes on").
timeout -k 2 60 "$bin" evaluate --load "$tmp/s6/m1.st" 2> s6/err3 | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 ]] || ! grep -qF "stdout is gone (the reader closed the pipe): the run goes on" s6/err3; then
  fail "6 evaluate | head -c 1: exit $rc, want 0 and the run's warning:"; tail -3 s6/err3
else
  ok "6 evaluate | head -c 1: exit 0, $(first "stdout is gone" s6/err3)"
fi
# stderr gone too (2>&1 into the closed pipe): no crash, no hang, and nowhere left to warn.
timeout -k 2 60 "$bin" "${small[@]}" --epochs 2 --save "$tmp/s6/m3.st" 2>&1 | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 ]]; then
  fail "6 singleton 2>&1 | head -c 1: exit $rc (141: killed by SIGPIPE)"
elif ! loadable s6/m3.st; then
  fail "6 singleton 2>&1 | head -c 1: --save was not written"
else
  ok "6 singleton 2>&1 | head -c 1: exit 0, --save written"
fi
# Through the launcher (this part is launch/mpirun.sh's): plain mpirun aborts the job after more than
# 10 writes into a closed pipe, so this run prints more lines than that (an epoch line per step).
timeout -k 2 60 bash "$launcher" -np 2 "$bin" "${small[@]}" --epochs 15 --max-steps 1 \
  --save "$tmp/s6/m2.st" 2> s6/err2 | head -c 1 > /dev/null
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 ]]; then
  fail "6 launch/mpirun.sh -np 2 | head -c 1: exit $rc"; tail -3 s6/err2
elif ! loadable s6/m2.st; then
  fail "6 launch/mpirun.sh -np 2 | head -c 1: --save was not written"
else
  ok "6 launch/mpirun.sh -np 2 | head -c 1: exit 0, --save written"
fi
reap  # a launcher that died of SIGPIPE may leave its ranks behind

# ---- 7. A --save that fails (a full disk) names --save, and where the trained model went --------
# Before, the model was lost with the error: now a copy goes to a private directory under $TMPDIR,
# or, where the run wrote a checkpoint of its last step, the message names that instead.
mkdir -p s7/full s7/rescue
if [[ $(id -u) -ne 0 ]] || ! mount -t tmpfs -o size=64k tmpfs s7/full 2>/dev/null; then
  echo "skip: 7 --save on a full disk: cannot mount a 64 KiB tmpfs here (needs root)"
else
  mounted=$tmp/s7/full
  TMPDIR=$tmp/s7/rescue run s7/log 60 "$bin" "${small[@]}" --save "$tmp/s7/full/m.st"  # LeNet: 518 KB into 64 KiB
  rc=$?
  copy=$(compgen -G "$tmp/s7/rescue/dptrain-rescue-*/m.st")
  if [[ $rc -ne 2 ]] || ! grep -qF -- "--save $tmp/s7/full/m.st" s7/log; then
    fail "7 --save on a full disk: exit $rc, no message naming --save:"; tail -3 s7/log
  elif [[ -z $copy ]] || ! grep -qF "the trained model was written to $copy instead" s7/log; then
    fail "7 --save on a full disk: no copy of the model, or not named:"; tail -3 s7/log
  elif ! loadable "$copy" || [[ $(stat -c %a "$(dirname "$copy")") != 700 ]] ||
      ! timeout 60 "$bin" evaluate --load "$copy" --threads 1 > s7/eval 2>&1; then
    fail "7 --save on a full disk: the copy $copy is not whole, private and evaluable"; tail -3 s7/eval
  else
    ok "7 --save on a full disk: exit $rc, $(first "--save" s7/log | cut -c1-60)..., the copy evaluates"
  fi
  # With checkpoints, the last one holds the trained model: it is named, and no copy is made.
  TMPDIR=$tmp/s7/rescue run s7/log2 60 "$bin" "${small[@]}" --save "$tmp/s7/full/m.st" \
    --checkpoint-every 1 --checkpoint-path "$tmp/s7/ck.st"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF "the trained model is in this run's checkpoint $tmp/s7/ck.st (global step 2)" s7/log2 ||
      [[ $(compgen -G "$tmp/s7/rescue/dptrain-rescue-*" | wc -l) -ne 1 ]]; then
    fail "7 --save on a full disk with checkpoints: exit $rc, the checkpoint not named, or a copy made:"; tail -3 s7/log2
  else
    ok "7 --save on a full disk with checkpoints: exit $rc, the checkpoint named"
  fi
fi

# ---- 8. Two runs with one output: the second is refused, and the lock dies with its run ----------
# Run A holds --metrics, --report, --trace and --checkpoint-path (no checkpoint is due for 1000
# epochs) until it is killed; it runs past its pre-flight once its first epoch record is written.
mkdir -p s8
long=(--model lenet --epochs 100000 --max-steps 2 --eval-every 0 --threads 1 --batch-size 64 --progress off)
held=(--metrics "$tmp/s8/m.jsonl" --report "$tmp/s8/r.svg" --trace "$tmp/s8/t.json" --trace-steps 1:2
      --checkpoint-every 1000 --checkpoint-path "$tmp/s8/ck.st")
"$bin" "${long[@]}" "${held[@]}" > s8/a.log 2>&1 &
a=$!
for _ in $(seq 900); do [[ -s s8/m.jsonl ]] && break; sleep 0.1; done
[[ -s s8/m.jsonl ]] || fail "8 run A wrote no metrics record in 90 s: $(tail -2 s8/a.log)"
# flag|file|what else the flag needs
for spec in "--metrics|m.jsonl|" "--report|r.svg|" "--trace|t.json|--trace-steps 1:2" \
            "--checkpoint-path|ck.st|--checkpoint-every 1"; do
  IFS='|' read -r flag f extra <<< "$spec"
  # shellcheck disable=SC2086  # $extra: zero or two words
  run s8/b.log 60 "$bin" "${small[@]}" "$flag" "$tmp/s8/$f" $extra
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag $tmp/s8/$f is in use by another run (pid $a on host" s8/b.log; then
    fail "8 a second run with $flag of a running one: exit $rc (want 2 naming the file and pid $a):"; tail -3 s8/b.log
  else
    ok "8 second run with $flag: exit 2, $(first "in use" s8/b.log)"
  fi
done
if python3 -c 'import sys; sys.exit(b"\0" in open(sys.argv[1], "rb").read())' s8/m.jsonl; then
  ok "8 run A's metrics hold no NUL byte: nobody truncated them"
else
  fail "8 run A's metrics were truncated under it (NUL bytes)"
fi
kill -9 "$a" 2>/dev/null
wait "$a" 2>/dev/null
# Killed: the kernel dropped its locks; whatever it left must not refuse the next run.
run s8/c.log 60 "$bin" "${small[@]}" "${held[@]}"
rc=$?
[[ $rc -eq 0 ]] && ok "8 after run A was killed (SIGKILL), a run with its outputs runs" ||
  { fail "8 after run A was killed (SIGKILL), a run with its outputs: exit $rc"; tail -3 s8/c.log; }
ls s8/*.lock >/dev/null 2>&1 && fail "8 a run that ended left lock files: $(ls s8/*.lock)"
# A symlink planted at the lock's name (a shared directory) is refused, never followed.
ln -s "$tmp/s8/victim" s8/p.jsonl.lock
run s8/d.log 60 "$bin" "${small[@]}" --metrics "$tmp/s8/p.jsonl"
rc=$?
if [[ $rc -ne 2 ]] || [[ -e s8/victim ]] || ! grep -qF -- "$tmp/s8/p.jsonl.lock: it is a symlink" s8/d.log; then
  fail "8 a symlink planted at the lock file: exit $rc (want 2 naming it), victim $([[ -e s8/victim ]] && echo created)"
  tail -3 s8/d.log
else
  ok "8 planted symlink at the lock file: $(first "symlink" s8/d.log)"
fi
# Two flags of one run naming one file.
run s8/e.log 60 "$bin" "${small[@]}" --report "$tmp/s8/x" --trace "$tmp/s8/x"
rc=$?
[[ $rc -eq 2 ]] && grep -qF -- "--trace $tmp/s8/x is the file --report names" s8/e.log && ok "8 --report and --trace one file: refused" ||
  { fail "8 --report and --trace naming one file: exit $rc"; tail -3 s8/e.log; }

# ---- 9. An output that is one of the run's inputs is refused, the input left as it was ------------
# --metrics appended JSON to the checkpoint being resumed; --report/--trace/--save replaced the
# --init-from file. A run resuming its own checkpoint and rewriting it is the normal case.
mkdir -p s9 && python3 "$lib_dir/../data/make_data.py" s9/data --format idx --train 64 --test 16 \
  --rows 28 --cols 28 --classes 10 --seed 9 > /dev/null || fail "9 make_data.py"
run s9/base.log 60 "$bin" "${small[@]}" --data s9/data --checkpoint-every 1 --checkpoint-path "$tmp/s9/r.st" ||
  { fail "9 the checkpoint to resume: exit $?"; tail -3 s9/base.log; }
cp s9/r.st s9/a.st && cksum s9/a.st s9/r.st s9/data/* > s9/sums
# flag|file|input flags|what else the flag needs
for spec in "--metrics|a.st|--init-from|" "--report|a.st|--init-from|" \
            "--trace|a.st|--init-from|--trace-steps 1:2" "--save|a.st|--init-from|" \
            "--checkpoint-path|a.st|--init-from|--checkpoint-every 1" "--metrics|r.st|--resume|" \
            "--report|data/train-labels-idx1-ubyte|--data|"; do
  IFS='|' read -r flag f input extra <<< "$spec"
  from=("$input" "$tmp/s9/$f")
  [[ $input == --data ]] && from=()
  # shellcheck disable=SC2086  # $extra: zero or two words
  run s9/b.log 60 "$bin" "${small[@]}" --data s9/data "${from[@]}" "$flag" "$tmp/s9/$f" $extra
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag $tmp/s9/$f is the file $input reads" s9/b.log; then
    fail "9 $flag naming the $input file: exit $rc (want 2 naming both):"; tail -3 s9/b.log
  else
    ok "9 $flag naming the $input file: $(first "is the file" s9/b.log)"
  fi
done
cksum s9/a.st s9/r.st s9/data/* | cmp -s - s9/sums && ok "9 the refused runs left their inputs as they were" ||
  fail "9 a refused run changed an input"
run s9/c.log 60 "$bin" "${small[@]}" --data s9/data --epochs 2 --checkpoint-every 1 \
  --checkpoint-path "$tmp/s9/r.st" --resume "$tmp/s9/r.st" --allow-config-change --metrics "$tmp/s9/m.jsonl"
rc=$?
[[ $rc -eq 0 ]] && loadable s9/r.st && ok "9 a resume rewriting its own checkpoint runs" ||
  { fail "9 a resume rewriting its own checkpoint: exit $rc"; tail -3 s9/c.log; }

# ---- 10. Another user's symlink in a shared directory is not written through --------------------
# The kernel's fs.protected_symlinks rule, applied by dptrain (the kernel's does not cover a rename
# and is often off): a link owned by nobody (uid 65534), planted at an output's name in a 1777
# directory, named the operator's file, and the output replaced that file. Root only (chown -h).
if [[ $(id -u) -ne 0 ]]; then
  echo "skip: 10 another user's symlink: making a link another user's needs root"
else
  mkdir -p s10/w && chmod 1777 s10/w && echo "precious" > s10/precious.txt && chmod 600 s10/precious.txt
  cp s10/precious.txt s10/precious.orig
  run s10/model.log 60 "$bin" "${small[@]}" --save "$tmp/s10/m.st" ||
    { fail "10 the model to evaluate: exit $?"; tail -3 s10/model.log; }
  plant() { rm -f "$1" && ln -s "$tmp/s10/precious.txt" "$1" && chown -h 65534 "$1"; }
  eval_args=(--load "$tmp/s10/m.st" --data synthetic:28x28x1:64:10 --threads 1)
  # flag|command and the flags it needs|file in w/
  for spec in "--checkpoint-path|train --checkpoint-every 1|ck.st" "--save|train|m.st" \
              "--metrics|train|m.jsonl" "--report|train|r.svg" "--trace|train --trace-steps 1:2|t.json" \
              "--output|predict|p.csv" "--metrics|evaluate|e.json"; do
    IFS='|' read -r flag cmd f <<< "$spec"
    read -ra words <<< "$cmd"
    plant "s10/w/$f"
    if [[ ${words[0]} == train ]]; then
      args=("${small[@]}" "${words[@]:1}")
    else
      args=("${words[0]}" "${eval_args[@]}")
    fi
    run s10/log 60 "$bin" "${args[@]}" "$flag" "$tmp/s10/w/$f"
    rc=$?
    if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag $tmp/s10/w/$f is a symbolic link (to $tmp/s10/precious.txt) owned by uid 65534" s10/log; then
      fail "10 ${words[0]} $flag at another user's symlink: exit $rc (want 2 naming the link):"; tail -3 s10/log
    elif ! cmp -s s10/precious.txt s10/precious.orig || [[ ! -L s10/w/$f ]]; then
      fail "10 ${words[0]} $flag wrote through another user's symlink"
    else
      ok "10 ${words[0]} $flag: $(first "symbolic link" s10/log)"
    fi
  done
  # The step-named checkpoints of --keep-checkpoints ahead are checked before the first step (and
  # again when written): exit 2 naming it, before any training, the file it names untouched.
  plant s10/w/k.step2.st
  run s10/keep.log 60 "$bin" "${small[@]}" --checkpoint-every 2steps --keep-checkpoints 2 \
    --checkpoint-path "$tmp/s10/w/k.st"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$tmp/s10/w/k.step2.st is a symbolic link" s10/keep.log; then
    fail "10 a step-named checkpoint at another user's symlink: exit $rc (want 2 naming it):"
    tail -3 s10/keep.log
  elif ! cmp -s s10/precious.txt s10/precious.orig; then
    fail "10 a step-named checkpoint wrote through another user's symlink"
  elif ! grep -qF -- "--checkpoint-path $tmp/s10/w/k.st: the checkpoint name $tmp/s10/w/k.step2.st is a symbolic link" s10/keep.log; then
    fail "10 a step-named checkpoint at another user's symlink was found only after training began"
  else
    ok "10 step-named checkpoint: $(first "symbolic link" s10/keep.log)"
  fi
  # One's own link in the same directory is followed: the file it names gets the output.
  ln -s "$tmp/s10/mine.st" s10/w/own.st && : > s10/mine.st
  run s10/own.log 60 "$bin" "${small[@]}" --save "$tmp/s10/w/own.st"
  rc=$?
  if [[ $rc -ne 0 ]] || ! loadable s10/mine.st || [[ ! -L s10/w/own.st ]]; then
    fail "10 --save through one's own link in a shared directory: exit $rc"; tail -3 s10/own.log
  else
    ok "10 one's own link in a shared directory is followed"
  fi
fi

# ---- 11. Another user's file in a sticky directory is refused before the first step -------------
# Only the file's owner (or the directory's, or root) may replace a file in a sticky directory, however
# writable it is. A user's run given root's mode-666 file in a 1777 directory passed the pre-flight,
# trained, and the rename failed (EPERM) at the end: --save lost, a checkpoint stopped the run. A
# --metrics (appended to in place) still works, and a resume trims it in place. Run as uid 65534
# through setpriv, on a copy of the binary the user can reach; root's own runs replace such files
# (CAP_FOWNER).
if [[ $(id -u) -ne 0 ]] || ! command -v setpriv >/dev/null; then
  echo "skip: 11 another user's file in a sticky directory: needs root and setpriv to run as another user"
else
  chmod 711 "$tmp" && mkdir -p s11/w && chmod 755 s11 && chmod 1777 s11/w && cp "$bin" s11/dptrain
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  run s11/model.log 60 "$bin" "${small[@]}" --save "$tmp/s11/m.st" && chmod 644 s11/m.st ||
    { fail "11 the model to evaluate: exit $?"; tail -3 s11/model.log; }
  eval_args=(--load "$tmp/s11/m.st" --data synthetic:28x28x1:64:10 --threads 1)
  for spec in "--checkpoint-path|train --checkpoint-every 1|ck.st" "--save|train|m.st" \
              "--report|train|r.svg" "--trace|train --trace-steps 1:2|t.json" \
              "--output|predict|p.csv" "--metrics|evaluate|e.json"; do
    IFS='|' read -r flag cmd f <<< "$spec"
    read -ra words <<< "$cmd"
    echo "root's" > "s11/w/$f" && chmod 666 "s11/w/$f"
    if [[ ${words[0]} == train ]]; then
      args=("${small[@]}" "${words[@]:1}")
    else
      args=("${words[0]}" "${eval_args[@]}")
    fi
    run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${args[@]}" "$flag" "$tmp/s11/w/$f"
    rc=$?
    if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag $tmp/s11/w/$f: the file exists and is owned by uid 0 in a sticky directory" s11/log; then
      fail "11 ${words[0]} $flag at root's file in a sticky directory: exit $rc (want 2 naming it):"; tail -3 s11/log
    elif grep -q "^epoch 1/1" s11/log; then
      fail "11 ${words[0]} $flag at root's file in a sticky directory was refused only after training"
    else
      ok "11 ${words[0]} $flag: $(first "sticky" s11/log)"
    fi
    rm -f "s11/w/$f"
  done
  # Root's checkpoint in the user's own directory: not replaced (the user may not write it); the
  # message says how to continue it, and that works.
  mkdir -p s11/own && chown 65534:65534 s11/own
  run s11/log 60 "$bin" "${small[@]}" --checkpoint-every 1 --checkpoint-path "$tmp/s11/own/ck.st" &&
    chmod 644 s11/own/ck.st || { fail "11 root's checkpoint: exit $?"; tail -3 s11/log; }
  resume=("${small[@]}" --epochs 2 --allow-config-change --checkpoint-every 1 --resume "$tmp/s11/own/ck.st")
  run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${resume[@]}" --checkpoint-path "$tmp/s11/own/ck.st"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "the file exists and is not writable (owned by uid 0, mode 644): dptrain does not replace a file you may not write; choose another path (--resume can still read this one" s11/log; then
    fail "11 root's checkpoint resumed at its own path by another user: exit $rc (want 2 saying how):"; tail -3 s11/log
  elif ! run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${resume[@]}" --checkpoint-path "$tmp/s11/own/mine.st" ||
       ! loadable s11/own/mine.st; then
    fail "11 root's checkpoint resumed by another user into its own --checkpoint-path"; tail -3 s11/log
  else
    ok "11 root's checkpoint, resumed by another user into its own --checkpoint-path"
  fi
  # A user continuing root's training in the sticky directory cannot remove root's older
  # checkpoints: --keep-checkpoints says so, once per file (it kept them without a word).
  keep=(--checkpoint-every 1 --keep-checkpoints 1 --checkpoint-path "$tmp/s11/w/k.st" --resume auto)
  run s11/log 60 "$bin" "${small[@]}" "${keep[@]}" || { fail "11 root's training: exit $?"; tail -3 s11/log; }
  run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${small[@]}" --epochs 3 --allow-config-change "${keep[@]}"
  rc=$?
  n=$(grep -c "warning: --keep-checkpoints 1: cannot remove $tmp/s11/w/k.step2.st, an older checkpoint of this training" s11/log)
  if [[ $rc -ne 0 || $n -ne 1 || -e s11/w/k.step4.st || ! -e s11/w/k.step6.st ]]; then
    fail "11 --keep-checkpoints over root's older checkpoint: exit $rc, $n warning(s) (want 1): $(ls s11/w | tr '\n' ' ')"
    tail -3 s11/log
  else
    ok "11 --keep-checkpoints names root's checkpoint it cannot remove, once"
  fi
  echo "root's" > s11/w/m.jsonl && chmod 666 s11/w/m.jsonl
  if [[ $(cat /proc/sys/fs/protected_regular 2>/dev/null || echo 0) != 0 ]]; then
    # The kernel then refuses to open it (O_CREAT on another user's file in a sticky directory).
    echo "skip: 11 --metrics into root's writable file in a sticky directory: fs.protected_regular is on"
  else
    run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${small[@]}" --metrics "$tmp/s11/w/m.jsonl"
    rc=$?
    if [[ $rc -ne 0 ]] || ! grep -q '"type":"epoch"' s11/w/m.jsonl; then
      fail "11 --metrics appended to root's writable file in a sticky directory: exit $rc"; tail -3 s11/log
    else
      ok "11 --metrics into root's writable file in a sticky directory is appended to"
    fi
    # Root's 2-epoch training continued by the user from epoch 1's checkpoint with root's
    # --metrics: the record of root's epoch 2 must go, and the rename that trims it atomically
    # is root's alone ("cannot rename ...: Operation not permitted", exit 2 at start). Trimmed in
    # place: root's epoch 1 and the user's epoch 2, in root's file (same inode).
    rm -f s11/w/m.jsonl s11/w/r.st s11/w/r.step*.st
    run s11/log 60 "$bin" "${small[@]}" --epochs 2 --checkpoint-every 1 --keep-checkpoints 2 \
      --checkpoint-path "$tmp/s11/w/r.st" --metrics "$tmp/s11/w/m.jsonl" || { fail "11 root's metrics training: exit $?"; tail -3 s11/log; }
    chmod 666 s11/w/m.jsonl && chmod 644 s11/w/r.step*.st
    inode=$(stat -c %i s11/w/m.jsonl)
    run s11/log 60 "${as_user[@]}" "$tmp/s11/dptrain" "${small[@]}" --epochs 2 --checkpoint-every 1 \
      --resume "$tmp/s11/w/r.step2.st" --checkpoint-path "$tmp/s11/own/r.st" --metrics "$tmp/s11/w/m.jsonl"
    rc=$?
    epochs=$(python3 -c 'import json,sys; print([r["epoch"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "epoch"])' s11/w/m.jsonl)
    if [[ $rc -ne 0 || $epochs != "[1, 2]" || $(stat -c %i:%U s11/w/m.jsonl) != "$inode:root" ]] ||
       ! grep -qF -- "--metrics: 1 record(s) past the checkpoint dropped" s11/log; then
      fail "11 resumed with root's --metrics in a sticky directory: exit $rc, epochs $epochs (want [1, 2]), $(stat -c 'inode %i of %U' s11/w/m.jsonl) (want $inode of root)"
      tail -3 s11/log
    else
      ok "11 resumed with root's --metrics in a sticky directory: trimmed in place, appended to"
    fi
  fi
fi

# ---- 12. A name too long for its temporary file is refused before the first step ---------------
# Every output is written through "<name>.tmp.<pid>.<random>" beside it: a name that fits only
# without that suffix (NAME_MAX, 255 bytes on most file systems) passed the pre-flight, trained,
# and failed with ENAMETOOLONG at the first write: --save after the whole training.
long=$(printf 'n%.0s' {1..240})
mkdir -p s12
for flag in --save --report --checkpoint-path; do
  extra=()
  [[ $flag == --checkpoint-path ]] && extra=(--checkpoint-every 1)
  run s12/log 60 "$bin" "${small[@]}" "${extra[@]}" "$flag" "s12/$long.st"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$flag s12/$long.st: the file name is too long for the temporary file" s12/log; then
    fail "12 $flag with a 243-byte name: exit $rc (want 2 naming it):"; tail -3 s12/log | cut -c1-300
  elif grep -q "^epoch 1/1" s12/log; then
    fail "12 $flag with a 243-byte name was refused only after training"
  else
    ok "12 $flag: $(grep -o 'the file name is too long.*' s12/log)"
  fi
done
# The step names of --keep-checkpoints are longer than --checkpoint-path: the last one counts.
run s12/log 60 "$bin" "${small[@]}" --checkpoint-every 1 --keep-checkpoints 2 \
  --checkpoint-path "s12/${long:0:228}.st"
rc=$?
if [[ $rc -ne 2 ]] || ! grep -qF -- ".step2.st: the file name is too long for the temporary file" s12/log; then
  fail "12 a step-named checkpoint too long for its temporary: exit $rc (want 2 naming it):"
  tail -3 s12/log | cut -c1-300
else
  ok "12 step name: $(grep -o 'the file name is too long.*' s12/log)"
fi

# ---- 13. An output that is the run's own standard output or error is refused ------------------
# `--metrics /dev/stdout > run.log` opened run.log again, truncating it: the records wrote over the
# banner, the log's later lines wrote over the records at their own offset, and the gap between
# became NUL bytes. An atomic output renamed over the log's file took the log with it. Refused
# before anything is written, naming the flag and the stream.
mkdir -p s13
# flag|path|redirection of the run|stream|what else the flag needs
for spec in "--metrics|/dev/stdout|out|standard output|" "--metrics|s13/log|out|standard output|" \
            "--report|/dev/stderr|err|standard error|" "--save|s13/log|err|standard error|" \
            "--checkpoint-path|s13/log|out|standard output|--checkpoint-every 1"; do
  IFS='|' read -r flag path into stream extra <<< "$spec"
  if [[ $into == out ]]; then
    # shellcheck disable=SC2086  # $extra: zero or two words
    timeout -k 2 60 "$bin" "${small[@]}" "$flag" "$path" $extra > s13/log 2> s13/other
  else
    # shellcheck disable=SC2086
    timeout -k 2 60 "$bin" "${small[@]}" "$flag" "$path" $extra 2> s13/log > s13/other
  fi
  rc=$?
  cat s13/log s13/other > s13/both
  if [[ $rc -ne 2 ]] || ! grep -qaF -- "$flag $path is the file this run's $stream goes to" s13/both; then
    fail "13 $flag $path into its own $stream: exit $rc (want 2 naming it):"
    tr '\0' '@' < s13/both | tail -c 300; echo
  elif [[ $(tr -d '\0' < s13/log | wc -c) -ne $(wc -c < s13/log) ]]; then
    fail "13 $flag $path into its own $stream: NUL bytes in the log"
  else
    ok "13 $flag $path into its own $stream: $(first "is the file" s13/both)"
  fi
done
# Through launch/mpirun.sh the ranks' streams are pipes to its relays, which copy them into the
# launcher's own: `--metrics s13/log > s13/log` corrupted the log there alike. The launcher names its
# files to the ranks; rank 0 refuses such an output.
for spec in "--metrics|out|standard output" "--save|err|standard error"; do
  IFS='|' read -r flag into stream <<< "$spec"
  if [[ $into == out ]]; then
    timeout -k 2 90 bash "$launcher" -np 2 "$bin" "${small[@]}" "$flag" s13/log > s13/log 2> s13/other
  else
    timeout -k 2 90 bash "$launcher" -np 2 "$bin" "${small[@]}" "$flag" s13/log 2> s13/log > s13/other
  fi
  rc=$?
  cat s13/log s13/other > s13/both
  if [[ $rc -ne 2 ]] ||
     ! grep -qaF -- "$flag s13/log is the file launch/mpirun.sh's $stream goes to" s13/both; then
    fail "13 launch/mpirun.sh -np 2 ... $flag s13/log into its $stream: exit $rc (want 2 naming it):"
    tr '\0' '@' < s13/both | tail -c 300; echo
  else
    ok "13 launch/mpirun.sh -np 2 ... $flag into its $stream: $(first "is the file" s13/both)"
  fi
done
reap
# Into a terminal or /dev/null (character devices) a training's --metrics still goes (appended).
timeout -k 2 60 "$bin" "${small[@]}" --metrics /dev/stdout > /dev/null 2> s13/null.log
rc=$?
[[ $rc -eq 0 ]] && ok "13 --metrics /dev/stdout > /dev/null runs" ||
  { fail "13 --metrics /dev/stdout > /dev/null: exit $rc"; tail -3 s13/null.log; }

# ---- 14. A killed writer's temporaries of every output are removed at its next run -----------
# Only checkpoint leftovers were: a --save or predict --output killed (SIGKILL, the OOM killer)
# while writing left "<file>.tmp.<pid>.<random>" beside it for good (100 MB for a ResNet-50
# --save). Removed once the output's lock is held: regular files of this user whose writer is
# gone. Kept: a live writer's (this shell's pid), another user's, a symlink, another file's. The
# dead writers' pids are above 2^22, the largest pid_max Linux allows: no process has them.
mkdir -p s14 && echo "victim" > s14/victim
gone=(s14/m.st.tmp.4194309.AbCdEf s14/m.st.tmp.4194308 s14/p.csv.tmp.4194304.AbCdEf)
kept=(s14/m.st.tmp.$$.AbCdEf s14/m.st.tmp.4194307.Other s14/m.st.tmp.4194306.Link s14/x.st.tmp.4194305.AbCdEf)
for p in 4194309 4194308 4194307 4194306 4194305 4194304; do
  kill -0 "$p" 2>/dev/null && fail "14 pid $p runs: this check needs it free"
done
touch "${gone[@]}" s14/m.st.tmp.$$.AbCdEf s14/m.st.tmp.4194307.Other s14/x.st.tmp.4194305.AbCdEf
chown nobody s14/m.st.tmp.4194307.Other
ln -s "$tmp/s14/victim" s14/m.st.tmp.4194306.Link
run s14/train.log 60 "$bin" "${small[@]}" --save "$tmp/s14/m.st"
rc=$?
run s14/predict.log 120 "$bin" predict --threads 1 --load "$tmp/s14/m.st" --data "$data" --output "$tmp/s14/p.csv"
rc2=$?
left=() wrong=()
for f in "${gone[@]}"; do [[ -e $f || -L $f ]] && left+=("$f"); done
for f in "${kept[@]}"; do [[ -e $f || -L $f ]] || wrong+=("$f"); done
if ((rc || rc2)); then
  fail "14 --save / predict --output beside a killed writer's temporaries: exit $rc / $rc2"
  tail -3 s14/train.log s14/predict.log
elif ((${#left[@]})); then
  fail "14 a killed writer's temporaries were left: ${left[*]}"
elif ((${#wrong[@]})); then
  fail "14 removed what is no dead writer's of this output: ${wrong[*]}"
elif ! grep -qF "removed $tmp/s14/m.st.tmp.4194309.AbCdEf, left by a killed writer of --save" s14/train.log ||
  ! grep -qF "removed $tmp/s14/p.csv.tmp.4194304.AbCdEf, left by a killed writer of --output" s14/predict.log; then
  fail "14 the removals are not logged: $(grep -h removed s14/train.log s14/predict.log)"
else
  ok "14 a killed writer's temporaries of --save and --output removed, logged; the others kept"
fi

echo "$fails failed"
[[ $fails -eq 0 ]]
