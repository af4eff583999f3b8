# Sourced by launch/mpirun.sh and launch/slurm/dptrain.sbatch: whether a job wrote a checkpoint
# since it started, which decides whether running it again (a restart, a requeue) can go on from
# where it stopped, without knowing how dptrain names its checkpoints. Rank 0 appends a line
# `<global step> <checkpoint path>` to the file DPT_CHECKPOINT_RECORD names after every checkpoint
# it writes (src/train/checkpoint.cc), so an attempt that made one grew the file. Rank 0 must run
# on the host that reads the record (the file is local).
# shellcheck shell=bash

# record_start FILE: FILE, empty, is the record (record_file); the caller gives its name to the
# ranks as DPT_CHECKPOINT_RECORD. Fails when FILE cannot be written.
record_start() {
  record_file=$1
  : >"$record_file"
}
# record_mark: notes the record's size before an attempt; record_grew: a checkpoint since then.
record_size() { stat -c %s -- "$record_file" 2>/dev/null || echo 0; }
record_mark() { record_before=$(record_size); }
record_grew() { (($(record_size) > record_before)); }
# record_newest: "step S, PATH" of the newest checkpoint recorded.
record_newest() {
  local line
  line=$(tail -n 1 -- "$record_file" 2>/dev/null)
  echo "step ${line/ /, }"
}
