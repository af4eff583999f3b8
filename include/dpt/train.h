// Training: configuration (flags and recipes), SGD with momentum and weight decay over the flat
// buffers, learning-rate schedules, the data sampler, and the Trainer that runs epochs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpt/error.h"
#include "dpt/nn.h"

namespace dpt {

struct TrainConfig {
  std::string model = "lenet";
  std::string recipe = "default";
  int epochs = 10;
  int64_t batch_size = 256;  // global, over all ranks
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string schedule = "cosine";  // constant | step | cosine
  double warmup_epochs = 1;
  std::vector<int> step_epochs;  // for schedule=step: multiply by step_gamma at these epochs
  double step_gamma = 0.1;
  std::string init = "kaiming";  // kaiming | d2l
  uint64_t seed = 42;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string device = "auto";  // auto | cpu | cuda
  bool tf32 = false;            // allow TF32 tensor cores in cuBLAS/cuDNN (GPU only)
  bool cuda_graphs = true;      // replay warm steps and evaluations as CUDA graphs (GPU only)
  std::string precision = "fp32";  // fp32 | bf16 (GPU only: bf16 operands of convolutions and GEMMs)
  int threads = 1;
  int64_t max_steps = 0;  // 0 = whole epoch
  int64_t eval_batch_size = 1000;
  int eval_every = 1;  // evaluate every N epochs and after the last (0 = never)
  std::string metrics;  // JSON lines file
  std::string save;     // safetensors at the end
  int checkpoint_every = 0;  // epochs between training checkpoints (0 = none)
  int64_t checkpoint_every_steps = 0;    // --checkpoint-every Nsteps
  double checkpoint_every_minutes = 0;   // --checkpoint-every Nmin
  int keep_checkpoints = 0;  // > 0: files named by step beside --checkpoint-path, the newest K kept
  bool checkpoints() const { return checkpoint_every > 0 || checkpoint_every_steps > 0 || checkpoint_every_minutes > 0; }
  std::string checkpoint_path = "checkpoint.safetensors";
  std::string resume;  // training checkpoint to continue from; "auto": the newest valid one, if any
  bool allow_config_change = false;  // --resume may continue with other training settings
  double bucket_mb = 25;
  double last_bucket_mb = 0;  // 0 = no separate small last bucket
  std::string grad_dtype = "fp32";  // fp32 | bf16 | fp16: the type gradient buckets travel in
  bool overlap = true;
  int accum_steps = 1;
  double clip_grad_norm = 0;        // > 0: clip the global gradient norm (torch clip_grad_norm_)
  std::string nonfinite = "stop";   // stop | skip: what follows a step with non-finite gradients
  int64_t nonfinite_max_skips = 10; // with skip: at most this many skipped steps in all
  bool sync_bn = false;
  bool scale_lr = false;
  int64_t verify_every = 0;
  double timeout = 300;
  std::string log_level = "info";
  bool quiet = false;
  std::string progress = "auto";  // auto | on | off: the per-epoch progress bar of rank 0
  int64_t metrics_every = 0;  // per-step metric records every N steps (0 = none)
  std::string report;         // learning-curve SVG, rewritten every epoch
  std::string trace;          // Chrome-trace JSON of a window of steps
  int64_t trace_begin = 2, trace_end = 12;  // --trace-steps A:B (global steps [A, B))

  std::string to_json() const;  // one line, every field
  std::string to_text() const;  // "key: value" lines for the start-up banner
};

// The values every rank must share, as (flag, value) pairs in a fixed order: everything that shapes
// the training (model, recipe, optimiser, schedule, batch, accumulation, epochs, steps, seed,
// numerics, buckets) or decides which collectives a rank issues (evaluation, checkpoints, step
// metrics, replica checks, and whether --resume, --save and --trace are given). Paths, threads,
// logging and --timeout may differ; the data files are compared by digest instead.
std::vector<std::pair<std::string, std::string>> agreed_values(const TrainConfig& cfg);
// The same values (without the three "given" ones) from a configuration's JSON (a checkpoint's
// metadata); keys it lacks read "(not recorded)". Throws on malformed JSON.
std::vector<std::pair<std::string, std::string>> agreed_values(const std::string& config_json);
// Of those, the ones a resumed run may change without changing the trajectory it continues.
bool may_change_on_resume(const std::string& flag);

// Parses argv (cxxopts): the recipe sets defaults, explicit flags override them; bad values are
// input errors naming the flag. Returns false when --help was printed (exit 0).
bool parse_config(int argc, char** argv, TrainConfig* cfg, std::string* help_text);
// --checkpoint-every's value: N or Nepochs, Nsteps, Nmin (input error naming the flag otherwise).
void parse_checkpoint_every(const std::string& value, TrainConfig* cfg);
// Applies recipe defaults for cfg.model/cfg.recipe (used by parse_config and by tests).
void apply_recipe(TrainConfig* cfg);
// Checks ranges and the world size (batch divisible by it); throws input errors naming the flag.
void validate_config(const TrainConfig& cfg, int world_size);

// Learning rate of optimizer step `step` (0-based, counted over the whole run) with
// `steps_per_epoch` steps an epoch: linear warm-up over cfg.warmup_epochs, then the schedule.
// cfg.lr is the peak rate (already scaled when --scale-lr is given).
double learning_rate(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch);

// PyTorch's SGD: g += wd * p; buf = momentum * buf + g (buf = g on the first step); p -= lr * buf.
class Sgd {
 public:
  Sgd(int64_t n, double momentum, double weight_decay)
      : n_(n), momentum_(momentum), weight_decay_(weight_decay), buf_(momentum > 0 ? n : 0) {}
  void step(float* params, const float* grads, double lr);
  std::vector<float>& momentum_buffer() { return buf_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 private:
  int64_t n_;
  double momentum_, weight_decay_;
  std::vector<float> buf_;
  int64_t steps_ = 0;
};

// Epoch e's order of the training set: one permutation from (seed, e), the same on every rank.
// Global batch s is positions [s*B, (s+1)*B); rank r takes its B/k slice. The last incomplete
// batch is dropped, so every rank takes the same number of steps.
class ShardedSampler {
 public:
  ShardedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world, uint64_t seed);
  void set_epoch(int64_t epoch);
  int64_t steps_per_epoch() const { return dataset_size_ / global_batch_; }
  int64_t local_batch() const { return global_batch_ / world_; }
  // The indices of this rank's part of global batch `step` (local_batch() of them).
  const int64_t* local_indices(int64_t step) const;

 private:
  int64_t dataset_size_, global_batch_;
  int rank_, world_;
  uint64_t seed_;
  std::vector<int64_t> perm_;
};

// Evaluation split: rank r scores test images [begin, end) so ranks cover each image exactly once.
std::pair<int64_t, int64_t> eval_range(int64_t n, int rank, int world);

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  int64_t test_count = 0, train_count = 0, steps = 0;
  double epoch_seconds = 0, images_per_second = 0, lr = 0;
  double comm_seconds = 0, exposed_comm_seconds = 0;
  double grad_norm = 0, grad_norm_max = 0;  // of the epoch's applied steps: mean and largest
  int64_t nonfinite_steps = 0;              // steps not applied (non-finite gradients)
  int world_size = 1;
  // Per-rank timings, gathered once at the epoch's end (seconds per step; see run_training for the
  // definitions): compute = the rank's step time less its exposed all-reduce wait; wait = that
  // wait plus the stop-flag all-reduce at step boundaries. The slowest rank by compute, its
  // compute, the median over ranks and (max - min) / median.
  int slowest_rank = 0;
  double slowest_compute_seconds = 0, median_compute_seconds = 0, compute_spread = 0;
  std::vector<double> rank_compute_seconds, rank_wait_seconds;  // in rank order
  std::string to_json() const;
  // The record to_json wrote (fields it lacks stay at their defaults; a null value is NaN).
  static EpochMetrics from_json(const std::string& json);
};

class Communicator;
class Tracer;
struct ReducerStats;

// This rank's summed loss, correct predictions and images over some training steps or an evaluation.
struct Totals {
  double loss = 0;
  int64_t correct = 0, count = 0;
};

// Writes the learning curves of `history` as a self-contained SVG (atomically).
void write_report_svg(const std::string& path, const std::vector<EpochMetrics>& history,
                      int epochs, const std::string& title);

// Thrown when a stop signal (INT, TERM, HUP, USR1) stopped training (every rank agrees on the
// step, a checkpoint is written first when checkpoints are configured); main exits with
// 128 + signal.
struct Stopped {
  int signal = 0;
  int64_t step = 0;
};
// "SIGTERM" for 15: how logs name a signal.
std::string signal_name(int sig);
// Blocks the stop signals (INT, TERM, HUP, USR1) in the calling thread and every thread it starts
// afterwards; run_training takes them on a thread of its own. main calls it before MPI starts.
void block_stop_signals();

// An input error every rank knows about (agreed by a collective), so no MPI_Abort is needed.
// Ranks that were not themselves at fault carry quiet = true and print nothing.
struct AgreedInputError : Error {
  AgreedInputError(const std::string& message, bool quiet_rank)
      : Error(ErrorKind::kInput, message), quiet(quiet_rank) {}
  bool quiet;
};

// Runs the configured training on this rank; rank 0 prints and writes metrics/checkpoints.
std::vector<EpochMetrics> run_training(const TrainConfig& cfg, Communicator& comm);

}  // namespace dpt
