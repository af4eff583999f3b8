#!/usr/bin/env bash
# What a user sees on bad input: every case must end with exit code 2 and a message naming the
# flag or file, never a crash or a hang (each run is bounded by `timeout`). Runs dptrain directly
# (an MPI singleton) and, for the world-size cases, under mpirun -np 3.
# Usage: test_cli.sh path/to/dptrain
set -uo pipefail
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist
EXPECT_TIMEOUT=60

# Flags.
expect 2 "--batch-size must be between 1 and 9223372036854775807, got 0" -- "$bin" --batch-size 0
expect 2 "--batch-size must be between 1 and 9223372036854775807, got -3" -- "$bin" --batch-size -3
expect 2 "--lr must be >= 0, got -0.1" -- "$bin" --lr -0.1
expect 2 "--epochs must be between 1 and 2147483647, got 0" -- "$bin" --epochs 0
# Past an int's range, the flag's own range and the value typed (it said "a whole number from
# -2147483648 to 2147483647").
expect 2 "--epochs must be between 1 and 2147483647, got 3000000000" -- "$bin" --epochs 3000000000
expect 2 "--top-k must be between 1 and 2147483647, got -3000000000" -- \
  "$bin" predict --load m.st --output p.csv --top-k -3000000000
expect 2 "--bucket-mb must be > 0" -- "$bin" --bucket-mb 0
expect 2 "--model: unknown model 'vgg'" -- "$bin" --model vgg
expect 2 "bogus" -- "$bin" --bogus
expect 2 "abc" -- "$bin" --epochs abc
expect 2 "no CUDA device visible" -- "$bin" --device cuda --data "$data"
expect 0 "--bucket-mb" -- "$bin" --help
# A --timeout past the clock's range failed every multi-rank run's first all-reduce at once.
expect 2 "--timeout 1e+10 is above the maximum of 10000000 s (115 days): use 0 for no limit" -- \
  "${mpi[@]}" -np 2 "$bin" --data synthetic:28x28x1:512:10 --epochs 1 --max-steps 2 --batch-size 64 --timeout 1e10
expect 2 "--step-epochs: each item must be between 1 and 2147483647, got -1" -- "$bin" --schedule step --step-epochs -1,0,100 --epochs 3
expect 2 "--step-epochs applies to --schedule step" -- "$bin" --step-epochs 2
expect 2 "--warmup-epochs 1e+308 is longer than the run" -- "$bin" --warmup-epochs 1e308 --epochs 3
expect 2 "--log-level: 'trace' is not one of" -- "$bin" --log-level trace --quiet
expect 2 "--augment: empty; use none" -- "$bin" --augment ""

# Data: missing directory, and corrupted copies of a small valid set.
expect 2 "/nonexistent/dir" -- "$bin" --data /nonexistent/dir
mk() {  # a directory with the real test labels/images as train and t10k, then a corruption
  local d=$tmp/$1
  mkdir -p "$d"
  cp "$data/t10k-images-idx3-ubyte.gz" "$d/train-images-idx3-ubyte.gz"
  cp "$data/t10k-labels-idx1-ubyte.gz" "$d/train-labels-idx1-ubyte.gz"
  cp "$data/t10k-images-idx3-ubyte.gz" "$d/t10k-images-idx3-ubyte.gz"
  cp "$data/t10k-labels-idx1-ubyte.gz" "$d/t10k-labels-idx1-ubyte.gz"
  echo "$d"
}
d=$(mk truncated); head -c 100000 "$data/t10k-images-idx3-ubyte.gz" > "$d/train-images-idx3-ubyte.gz"
expect 2 "train-images-idx3-ubyte.gz" -- "$bin" --data "$d" --epochs 1
d=$(mk notgzip); echo "this is not an IDX file at all" > "$d/t10k-labels-idx1-ubyte.gz"
expect 2 "t10k-labels-idx1-ubyte.gz" -- "$bin" --data "$d" --epochs 1
d=$(mk magic); rm "$d/train-labels-idx1-ubyte.gz"; printf '\x01\x02\x08\x01\x00\x00\x27\x10' > "$d/train-labels-idx1-ubyte"
expect 2 "magic" -- "$bin" --data "$d" --epochs 1
d=$(mk counts); rm "$d/train-labels-idx1-ubyte.gz"
python3 -c "import sys; sys.stdout.buffer.write(bytes([0,0,8,1,0,0,0,5]) + bytes(5))" > "$d/train-labels-idx1-ubyte"
expect 2 "10000" -- "$bin" --data "$d" --epochs 1
# The classes come from the training labels (0..9 here): a test label outside them is refused,
# naming the file, the index and the value.
d=$(mk label); rm "$d/t10k-labels-idx1-ubyte.gz"
python3 -c "import sys; sys.stdout.buffer.write(bytes([0,0,8,1,0,0,0x27,0x10]) + bytes([3]*9999 + [12]))" > "$d/t10k-labels-idx1-ubyte"
expect 2 "t10k-labels-idx1-ubyte: label 12 at index 9999" -- "$bin" --data "$d" --epochs 1
d=$(mk dtype); rm "$d/train-labels-idx1-ubyte.gz"
python3 -c "import sys; sys.stdout.buffer.write(bytes([0,0,0x0D,1,0,0,0x27,0x10]) + bytes(40000))" > "$d/train-labels-idx1-ubyte"
expect 2 "dtype" -- "$bin" --data "$d" --epochs 1
# A raw copy beside the .gz (gunzip -k) is not silently passed over: which one is meant?
d=$(mk both); gzip -dc "$d/train-labels-idx1-ubyte.gz" > "$d/train-labels-idx1-ubyte"
expect 2 "both train-labels-idx1-ubyte.gz and train-labels-idx1-ubyte exist" -- "$bin" --data "$d" --epochs 1

# Checkpoints.
printf 'garbage' > "$tmp/bad.safetensors"
expect 2 "bad.safetensors" -- "$bin" --resume "$tmp/bad.safetensors" --epochs 1
expect 2 "missing.safetensors" -- "$bin" --resume "$tmp/missing.safetensors" --epochs 1

# World size: a batch that 3 ranks cannot split, and a data error on every rank, under mpirun.
expect 2 "not divisible by the world size 3" -- "${mpi[@]}" -np 3 "$bin" --batch-size 256
expect 2 "/nonexistent/dir" -- "${mpi[@]}" -np 2 "$bin" --data /nonexistent/dir

# Output paths: empty (an unset variable), unwritable, or naming the checkpoint, refused before
# the first step; a disk that fills up loses the metrics with a warning, not the run.
quick=(--epochs 1 --max-steps 2 --eval-every 0)
for f in save resume metrics report trace data checkpoint-path; do
  expect 2 "--$f: empty path (an unset variable?)" -- "$bin" "${quick[@]}" "--$f" ""
done
expect 2 "the directory $tmp/nodir does not exist" -- "$bin" "${quick[@]}" --metrics "$tmp/nodir/m.jsonl"
expect 2 "--trace $tmp is a directory, not a file" -- "$bin" "${quick[@]}" --trace "$tmp"
expect 2 "names the training checkpoint (--checkpoint-path)" -- "$bin" "${quick[@]}" --checkpoint-every 1 \
  --checkpoint-path "$tmp/ck.st" --save "$tmp/../$(basename "$tmp")/ck.st"
expect 2 "names the checkpoint being resumed (--resume)" -- "$bin" "${quick[@]}" --resume "$tmp/r.st" --save "$tmp/r.st"
if [[ $(id -u) -ne 0 ]]; then  # root may write anywhere
  mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
  expect 2 "is not writable" -- "$bin" "${quick[@]}" --save "$tmp/ro/s.st"
fi
expect 0 "these outputs were not (all) written: --metrics" -- "$bin" --epochs 2 --max-steps 2 --eval-every 0 \
  --metrics /dev/full
expect 2 "nodir does not exist" -- "${mpi[@]}" -np 2 "$bin" "${quick[@]}" --metrics "$tmp/nodir/m.jsonl"

# A batch too large for the host is refused before the first step with the estimate (it would end
# in a bare SIGKILL from the kernel otherwise); two ranks on one host count twice.
expect 2 "MiB per image of a training step x 60000" -- "$bin" --model resnet18 --batch-size 60000 "${quick[@]}"
expect 2 "2 rank(s) x" -- "${mpi[@]}" -np 2 "$bin" --model resnet18 --batch-size 60000 "${quick[@]}"

# --grad-dtype: a value that is none of the three is refused naming it; bf16 buckets train, the
# replicas stay equal (--verify-every compares them bit for bit), and ranks started with another
# --grad-dtype are refused.
expect 2 "--grad-dtype: 'int8' is not fp32|bf16|fp16" -- "$bin" "${quick[@]}" --grad-dtype int8
expect 0 "epoch 1/1" -- "${mpi[@]}" -np 2 "$bin" --epochs 1 --max-steps 30 --batch-size 64 --eval-batch-size 2000 \
  --grad-dtype bf16 --verify-every 10
grep -q "replicas differ" "$tmp/out.txt" && fail "bf16 buckets: the replicas drifted apart"
expect 2 "ranks were started with different --grad-dtype" -- "${mpi[@]}" -np 1 "$bin" "${quick[@]}" --grad-dtype bf16 \
  : -np 1 "$bin" "${quick[@]}" --grad-dtype fp16

# Without mpirun, Open MPI makes its session directory in TMPDIR (or TEMP, TMP), creating what is
# missing: one it cannot make failed inside MPI_Init with pages of Open MPI's text ("Permission
# denied") and exit 1. One it can make still runs.
: >"$tmp/afile"
expect 2 "dptrain: error: TMPDIR=$tmp/afile/sub: Not a directory" -- env TMPDIR="$tmp/afile/sub" "$bin" \
  --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32
expect 2 "dptrain: error: TEMP=$tmp/afile: $tmp/afile is not a directory" -- env -u TMPDIR TEMP="$tmp/afile" \
  "$bin" --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32
# A link to nothing: Open MPI's "File exists" and exit 1.
ln -s "$tmp/nothing/here" "$tmp/dangling"
expect 2 "dptrain: error: TMPDIR=$tmp/dangling/sub: $tmp/dangling is a symbolic link to $tmp/nothing/here, which does not exist" -- \
  env TMPDIR="$tmp/dangling/sub" "$bin" --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32
expect 0 "epoch 1/1" -- env TMPDIR="$tmp/new/tmpdir" "$bin" \
  --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32
# A full file system (PMIx's store needs about 9 MiB) failed inside MPI_Init too: "PMIX ERROR:
# OUT-OF-RESOURCE", exit 1.
mkdir "$tmp/full"
if [[ $(id -u) -eq 0 ]] && mount -t tmpfs -o size=64k tmpfs "$tmp/full" 2>/dev/null; then
  expect 2 "dptrain: error: TMPDIR=$tmp/full/sub: its file system has 64 KiB free, and the session directory needs about 9 MiB" -- \
    env TMPDIR="$tmp/full/sub" "$bin" --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32
  umount "$tmp/full"
else
  echo "skip: a full TMPDIR needs root to mount a small tmpfs"
fi
expect 2 "cannot create a directory in $tmp/none (TMPDIR" -- env TMPDIR="$tmp/none" \
  bash "$here/../../launch/mpirun.sh" -np 1 "$bin" \
  --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 32

# A number flag is a number to its end: cxxopts kept what it could read, so --momentum 0,9 (a comma
# decimal separator) trained with momentum 0 and --lr 0.1x at 0.1, without a word.
expect 2 "--momentum: '0,9' is not a number (the decimal separator is '.', whatever the locale)" -- \
  "$bin" --momentum 0,9
expect 2 "--lr: '0.1x' is not a number" -- "$bin" --lr 0.1x
expect 2 "--timeout: '1.5.0' is not a number" -- "$bin" predict --load x --output y --timeout 1.5.0
# Below the smallest double: libstdc++ read 1e-400 as 0 without an error, so --label-smoothing
# 1e-400 trained without smoothing and --lr 1e-400 said "got 0". A zero written so stays 0.
expect 2 "--label-smoothing: '1e-400' is not a number a double can hold: it is too small, and would be 0" -- \
  "$bin" --label-smoothing 1e-400
expect 2 "--lr: '-3E-999' is not a number a double can hold: it is too small" -- "$bin" --lr -3E-999
expect 2 "--nesterov needs --momentum > 0 (and no dampening, as torch.optim.SGD), got --momentum 0" -- \
  "$bin" --nesterov --momentum 0.000e-999
# Every number is decimal, the whole value (read_number, include/dpt/text.h): cxxopts read the
# integer flags in hex (--epochs 0x10 ran 16 epochs), stod/strtod/sscanf took hex floats and
# leading blanks, and operator>> blanks and '+', while integers refused " 3" and +3.
expect 2 "--epochs: '0x10' is not a whole number" -- "$bin" --epochs 0x10
expect 2 "--epochs: '+3' is not a whole number" -- "$bin" --epochs +3
expect 2 "--top-k: '0x3' is not a whole number" -- "$bin" predict --load x --output y --top-k 0x3
expect 2 "--seed: '0x10' is not a whole number (decimal digits)" -- "$bin" --seed 0x10
expect 2 "--checkpoint-every: '0x2steps' is not N, Nepochs, Nsteps or Nmin" -- "$bin" --checkpoint-every 0x2steps
expect 2 "--normalize '0x1p-1/0.5': mean '0x1p-1' is not a number" -- "$bin" --normalize 0x1p-1/0.5
expect 2 "--betas: '0x0.8,0.9' is not B1,B2" -- "$bin" --optimizer adamw --betas 0x0.8,0.9
expect 2 "--trace-steps: ' 2:12' is not A:B" -- "$bin" --trace-steps " 2:12"
expect 2 "--lr: ' 0.1' is not a number" -- "$bin" --lr " 0.1"
# sscanf's %lf read DPT_FAULT_SLOW_RANK's factor in hex (0x2 was 2) and after blanks.
expect 2 "DPT_FAULT_SLOW_RANK=0:0x2: want RANK:FACTOR" -- env DPT_FAULT_SLOW_RANK=0:0x2 \
  "$bin" --data synthetic:28x28x1:128:10 --epochs 1 --max-steps 1 --batch-size 64 --eval-every 0
# A locale with a comma decimal separator changes nothing: flags, the log and --metrics keep '.'
# (dptrain never calls setlocale). The locale is compiled here (localedef) where glibc's sources are.
if localedef -i de_DE -f UTF-8 "$tmp/de_DE.UTF-8" >/dev/null 2>&1; then
  expect 0 "epoch 1/1" -- env LOCPATH="$tmp" LC_ALL=de_DE.UTF-8 "$bin" --data synthetic:28x28x1:64:10 \
    --epochs 1 --max-steps 1 --batch-size 32 --lr 0.125 --metrics "$tmp/de.jsonl"
  python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).readline()); sys.exit(r["lr"] != 0.125)' \
    "$tmp/de.jsonl" || fail "--metrics under LC_ALL=de_DE.UTF-8: $(head -c 300 "$tmp/de.jsonl")"
else
  echo "skip: a comma-decimal locale: localedef cannot make de_DE.UTF-8 here (package locales)"
fi

# A path that is not UTF-8 (a Latin-1 name) cannot be recorded in JSON: it ended the run with
# "unexpected failure: [json.exception.type_error.316]", exit 3; now exit 2 naming the flag.
# (The bad path is not among the last words, which expect's "ok:" line shows: the log stays text.)
expect 2 "--save $tmp/s\\xfe.st: the path is not valid UTF-8" -- "$bin" --save "$tmp/s"$'\xfe'".st" \
  --epochs 1 --max-steps 1 --eval-every 0
expect 2 "--data $tmp/d\\xff: the path is not valid UTF-8" -- "$bin" evaluate --data "$tmp/d"$'\xff' \
  --load x --threads 1

# Said, not refused: more compute threads than cores (100x slower without a word before), and a
# training set of one class (loss 0, accuracy 1 from the first step).
# The cores this process may run on (its affinity mask, as dptrain counts them): nproc without
# OMP_NUM_THREADS, which it would answer (lib.sh sets 1); online CPUs for the note on fewer.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) online=$(getconf _NPROCESSORS_ONLN)
expect 0 "more compute threads than its $cores core(s)" -- "$bin" --epochs 1 --max-steps 1 --eval-every 0 \
  --threads $((cores + 1))
# The cores are the affinity mask's, not the online count (std::thread::hardware_concurrency said
# nothing under taskset): one usable core of several, named, and a rank mpirun bound to one core
# (its default up to 2 ranks) with --threads 2 where the host has 2: the binding, and its fix.
# `first`: the first CPU this process may run on (CPU 0 may be outside a cpuset).
syn=(--data synthetic:28x28x1:64:10 --batch-size 16 --epochs 1 --max-steps 1 --eval-every 0)
first=$(taskset -cp $$ 2>/dev/null | sed 's/.*: //; s/[-,].*//')
if ((cores >= 2)) && [[ -n $first ]]; then
  # Of the host's online CPUs, or inside a container of fewer (a cgroup's cpuset), of the cpuset's.
  expect 0 "more compute threads than its 1 core(s) (CPUs $first of " -- \
    taskset -c "$first" "$bin" "${syn[@]}" --threads 2
  grep -qE "\(CPUs $first of (its $online online|the [0-9]+ its cgroup's cpuset allows):" \
    "$tmp/out.txt" ||
    fail "taskset -c $first: not the CPUs it could have: $(grep -F '(CPUs' "$tmp/out.txt")"
  bound=(mpirun --bind-to core -np 1)
  [[ $(id -u) -eq 0 ]] && bound+=(--allow-run-as-root)
  expect 0 "--threads 2, but rank(s) 0 on this host may run on only 1 core(s), as mpirun bound them" -- \
    "${bound[@]}" "$bin" "${syn[@]}" --threads 2
  grep -qF -- "start mpirun with --bind-to none, or with --map-by slot:PE=2" "$tmp/out.txt" ||
    fail "the binding warning lacks its fix: $(grep -F -- '--threads 2, but' "$tmp/out.txt")"
  expect 0 "epoch 1/1" -- "${mpi[@]}" -np 1 "$bin" "${syn[@]}" --threads 2
  grep -qF "core(s)" "$tmp/out.txt" && fail "--bind-to none, 2 threads on 2 cores: a core warning"
else
  echo "skip: the affinity cases need 2 usable CPUs and taskset ($cores usable)"
fi
# More ranks than cores at --threads 1 advised "use --threads 1": the advice is about the ranks.
expect 0 "$((cores + 1)) ranks on this host, more than its $cores core(s)" -- "${mpi[@]}" -np $((cores + 1)) \
  "$bin" --data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size $((cores + 1))
grep -q "use --threads 1" "$tmp/out.txt" && fail "more ranks than cores at --threads 1: advised --threads 1"
python3 - "$tmp/one" <<'PY'
import os, random, sys
def npy(path, shape, data):  # NumPy's format 1.0, uint8, C order
    head = "{'descr': '|u1', 'fortran_order': False, 'shape': %s, }" % (shape,)
    head += " " * (63 - (10 + len(head)) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode() + bytes(data))
os.makedirs(sys.argv[1], exist_ok=True)
for split, n in (("train", 64), ("test", 16)):
    npy(f"{sys.argv[1]}/{split}_images.npy", (n, 28, 28, 1), [random.randrange(256) for _ in range(n * 784)])
    npy(f"{sys.argv[1]}/{split}_labels.npy", (n,), [0] * n)
PY
expect 0 "every training label is class 0" -- "$bin" --data "$tmp/one" --epochs 1 --max-steps 1 --batch-size 16 \
  --save "$tmp/one.st"
# Scoring or predicting trains nothing: no word of the training labels there.
for cmd in evaluate predict; do
  [[ $cmd == predict ]] && out=(--output "$tmp/one.csv") || out=()
  expect 0 "" -- "$bin" $cmd --load "$tmp/one.st" --data "$tmp/one" "${out[@]}"
  grep -q "every training label" "$tmp/out.txt" && fail "$cmd warned about the training labels"
done

# A singleton whose PATH has no ssh or rsh (PATH unset, as under `env -i` or a program's own
# environment, or a PATH of other tools): Open MPI 4's daemon for the singleton looked for them to
# launch nothing, and MPI_Init failed with pages of text and exit 1. It starts, and trains.
syn=(--data synthetic:28x28x1:64:10 --epochs 1 --max-steps 1 --eval-every 0 --batch-size 16)
expect 0 "epoch 1/1" -- env -u PATH "$bin" "${syn[@]}"
expect 0 "epoch 1/1" -- env PATH=/nonexistent "$bin" "${syn[@]}"
# The CPU's switches in the environment: a value that is not one of theirs was ignored without a
# word (DPT_WINOGRAD=0 left Winograd on, DPT_CONV_BACKWARD=sgem the default rule); refused naming
# the variable and its values, as DPT_ISA is.
expect 2 "DPT_WINOGRAD=0: expected off" -- env DPT_WINOGRAD=0 "$bin" "${syn[@]}"
expect 2 "DPT_CONV_BACKWARD=sgem: expected onednn, sgemm or auto" -- \
  env DPT_CONV_BACKWARD=sgem "$bin" "${syn[@]}"
expect 2 "DPT_CPU_BF16=yes: expected off" -- env DPT_CPU_BF16=yes "$bin" "${syn[@]}" --precision bf16
expect 0 "epoch 1/1" -- env DPT_WINOGRAD=off DPT_CONV_BACKWARD=sgemm "$bin" "${syn[@]}"

echo "cli: $fails failure(s)"
[[ $fails -eq 0 ]]
