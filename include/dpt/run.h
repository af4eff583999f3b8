// Running a training: run_training, and how a run ends other than normally (a stop signal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/config.h"
#include "dpt/metrics.h"

namespace dpt {

class Communicator;

// Thrown when a stop signal (INT, TERM, HUP, USR1) stopped training (every rank agrees on the
// step, a checkpoint is written first when checkpoints are configured); main exits with
// 128 + signal.
struct Stopped {
  int signal = 0;
  int64_t step = 0;  // the last global step trained; -1: evaluate or predict, nothing written
};
// "SIGTERM" for 15: how logs name a signal.
std::string signal_name(int sig);
// Blocks the stop signals (INT, TERM, HUP, USR1) in the calling thread and every thread it starts
// afterwards; watch_stop_signals takes them on a thread of its own. main calls it before MPI
// starts.
void block_stop_signals();
// Starts the process's one watcher of the stop signals (once; run_training starts it where main
// has not): until a run holds them for its agreed stop (src/train/signals.h), a stop signal ends
// the job at once with 128 + signal, saying so. main calls it before MPI starts, after
// block_stop_signals.
void watch_stop_signals();

// Runs the configured training on this rank; rank 0 prints and writes metrics/checkpoints.
std::vector<EpochMetrics> run_training(const TrainConfig& cfg, Communicator& comm);

// After training (src/train/infer.cc), on the test split of --data, split across the ranks with
// the same results at any world size: `dptrain evaluate` prints (rank 0) the loss, top-1 and top-5
// accuracy, per-class accuracy and the confusion matrix of the --load model and writes them as one
// JSON line to --metrics; `dptrain predict` writes every image's top-k classes and probabilities
// to --output (CSV, rank 0, atomically). A model that does not fit the data is an input error.
void run_evaluate(const TrainConfig& cfg, Communicator& comm);
void run_predict(const TrainConfig& cfg, Communicator& comm);

}  // namespace dpt
