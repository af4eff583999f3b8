// What a training run measures and where it goes: the epoch record (its JSON is the --metrics line
// and the checkpoint's history), a rank's totals, and MetricsLogger, rank 0's outputs (the epoch
// line, --metrics, --report, the progress bar, step records, rank timings, the straggler watch).
#pragma once

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "dpt/config.h"

namespace dpt {

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  int64_t test_count = 0, train_count = 0, steps = 0;
  double epoch_seconds = 0, images_per_second = 0, lr = 0;
  // Achieved training TFLOP/s over every rank: images_per_second x 3 x the model's forward FLOPs
  // per image (Model::forward_flops); 0 where the model counts none.
  double train_tflops = 0;
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

// An epoch's running sums over all ranks, from its first step: the training loss, correct
// predictions and images, the steps, the gradient norms of the applied steps (their sum and the
// largest) and the count of skipped ones, and the seconds spent. A checkpoint written part-way
// through an epoch carries them (metadata "epoch_so_far"), so that the resumed run's record of that
// epoch is the whole epoch's, as the uninterrupted run's is.
struct EpochSoFar {
  double loss = 0;
  int64_t correct = 0, count = 0, steps = 0;
  double norm_sum = 0, norm_max = 0;
  int64_t applied = 0, nonfinite = 0;
  double seconds = 0, comm_seconds = 0, exposed_seconds = 0;
  std::string to_json() const;
  // The object to_json wrote; throws a std::exception on anything else (a missing key, a negative,
  // non-finite or fractional count, more correct predictions than images).
  static EpochSoFar from_json(const std::string& json);
};

// This rank's summed loss, correct predictions and images over some training steps or an
// evaluation.
struct Totals {
  double loss = 0;
  int64_t correct = 0, count = 0;
};

// Writes the learning curves of `history` as a self-contained SVG (atomically).
void write_report_svg(const std::string& path, const std::vector<EpochMetrics>& history, int epochs,
                      const std::string& title);

// A step's record in --metrics (--metrics-every), its values already global.
struct StepRecord {
  int epoch = 0;
  int64_t step = 0;
  double loss = 0, train_acc = 0, lr = 0, grad_norm = 0, images_per_second = 0;
  double allreduce_seconds = 0, exposed_comm_seconds = 0;
  int world_size = 1;
};

// Fills m's per-rank fields from every rank's {compute, wait} seconds per step (`all`, rank-major).
void set_rank_timings(EpochMetrics& m, const std::vector<double>& all);

// Rank 0's count, per rank, of consecutive epochs more than kSlower above the median compute time
// per step; warns once per streak, when it reaches kEpochs, naming the rank and its host. One slow
// epoch is noise (a page cache miss, a checkpoint), a streak is a slow host or a noisy neighbour.
// With two ranks the median is their mean, so the slow one must be 1.5 times the other.
class StragglerWatch {
 public:
  static constexpr double kSlower = 0.20;
  static constexpr int kEpochs = 3;
  // Returns the ranks warned about at this epoch.
  std::vector<int> epoch_done(const EpochMetrics& m, const std::vector<std::string>& hosts);

 private:
  std::vector<int> streak_;
};

// Rank 0's outputs, and the epoch records every rank keeps. Everything here only writes: the
// collectives that make the values global stay with the caller. A file that cannot be written (a
// full disk, a reader gone) is warned about once and again at the end, and training goes on.
class MetricsLogger {
 public:
  // `before`: the epochs a resumed checkpoint brought (the report draws them again). After a
  // resume at (epoch, global_step), --metrics keeps only the records up to there: the steps run
  // after it, before the interruption, are run again and recorded again.
  MetricsLogger(const TrainConfig& cfg, int rank, int world, std::vector<EpochMetrics> before,
                bool resumed, int64_t resumed_epoch, int64_t resumed_step);
  // Whether the progress bar is drawn (rank 0 on a terminal, or --progress on).
  bool progress() const { return progress_; }
  // The bar after `done` of `total` steps of epoch `epoch` (1-based).
  void draw_progress(int epoch, int64_t done, int64_t total, double loss, double images_per_second,
                     double elapsed);
  void end_progress();
  void step_record(const StepRecord& r);
  // End of an epoch: the line, the record, the report (rank 0) and the straggler watch.
  void epoch_done(const EpochMetrics& m, const std::vector<std::string>& hosts);
  // Off: no straggler warnings (ranks that take turns on a host's cores are slow by turns, which
  // says nothing of the host).
  void watch_stragglers(bool on) { watch_ = on; }
  void output_failed(const std::string& flag, const std::string& what);
  void report_failures();
  // Every epoch of the training (a checkpoint's history), and those this run trained.
  const std::vector<EpochMetrics>& history() const { return history_; }
  const std::vector<EpochMetrics>& ran() const { return ran_; }

 private:
  void keep_records_until(int64_t epoch, int64_t global_step);
  void write_metrics(const std::string& record);
  void check_metrics_path();

  const TrainConfig& cfg_;
  const int rank_;
  const std::string title_;
  bool progress_ = false;
  std::ofstream metrics_;
  // The regular file --metrics names, as opened (device, inode; 0 when not a regular file): a
  // file removed or replaced under the run is noticed at the next record (write_metrics).
  uint64_t metrics_dev_ = 0, metrics_ino_ = 0;
  // Removed or replaced: said once, listed at the end; records still go on (a failed write, in
  // failed_, stops them).
  bool metrics_path_lost_ = false;
  std::vector<EpochMetrics> history_, ran_;
  std::set<std::string> failed_;
  StragglerWatch stragglers_;
  bool watch_ = true;
};

}  // namespace dpt
