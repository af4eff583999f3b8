// The per-rank training engine, written once for every backend: one optimizer step (micro-batches
// in, totals out), evaluation and state synchronisation over a Model on a Backend, the
// DataParallel wrapper's Reducer and the backend's optimizer (SGD or AdamW). Where the backend
// records work (CUDA graphs), a warm step and a warm evaluation pass are replayed whole.
// run_training drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dpt/augment.h"
#include "dpt/backend.h"
#include "dpt/config.h"
#include "dpt/dataset.h"
#include "dpt/ddp.h"
#include "dpt/metrics.h"
#include "dpt/nn.h"
#include "dpt/optimizer.h"
#include "dpt/reducer.h"
#include "dpt/sampler.h"

namespace dpt {

class Communicator;
class Tracer;

class StepEngine {
 public:
  // The model must be built on its backend and wrapped by ddp; the data sets are mirrored in the
  // backend's memory, the parameters and optimizer state taken from the host (from_host).
  // Everything passed must outlive the engine. Training images go through `normalize` and `augment`
  // (drawn per epoch and image from --seed), test images through `normalize` only.
  StepEngine(const TrainConfig& cfg, Communicator& comm, Model& model, DataParallel& ddp,
             Optimizer& opt, const ImageSet& train, const ImageSet& test,
             const Normalization& normalize = {}, const AugmentSpec& augment = {});
  // Unwinding from an error, the backend is abandoned (queued work may wait for a dead peer);
  // otherwise everything in flight is drained first, bounded by --timeout.
  ~StepEngine();
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  std::string describe() const { return be_.describe(); }
  // The sampler is at the new epoch; micro-batches [0, batches) of it may be asked for.
  void begin_epoch(const ShardedSampler& sampler, int64_t batches);
  // One optimizer step on micro-batches [first, first + --accum-steps) of the epoch: forward,
  // softmax cross-entropy (with --label-smoothing) scaled by 1/(global batch x accumulation),
  // backward (the last micro-batch all-reduces the summed gradients bucket by bucket), the
  // optimizer at `lr` (weight decay by decay_ranges). `step` names it in errors.
  void step(int64_t first_batch, int64_t step, double lr, Tracer* tracer);
  const ReducerStats& reducer_stats() const { return stats_; }
  // The all-reduced gradients' sum of squares of every step of the epoch so far, in order (the host
  // waits for them), and of the last step alone. A step whose value is not finite changed nothing:
  // the backend's update skipped it (the non-finite guard; run_training decides what follows).
  std::vector<double> epoch_grad_sumsq();
  double last_grad_sumsq();
  // The name of the first parameter, in gradient-buffer (backward) order, whose gradient holds a
  // non-finite value now, or "" (the host waits for the gradients).
  std::string first_nonfinite_gradient();
  // This rank's totals of the last step, and of the epoch so far (the host waits for them).
  Totals step_totals() { return totals(step_first_); }
  Totals epoch_totals() { return totals(epoch_first_); }
  // Scores test images [begin, end) in batches of --eval-batch-size: this rank's totals (plain
  // cross-entropy: no label smoothing). `stop` (when given) is asked before each batch of an
  // evaluation run batch by batch (not one replayed as a CUDA graph, which is short): true ends it
  // there, with no totals.
  std::optional<Totals> evaluate(int64_t begin, int64_t end,
                                 const std::function<bool()>& stop = nullptr);
  // BatchNorm running statistics averaged across ranks (DataParallel::sync_buffers).
  void sync_buffers();
  // Parameters, buffers and the optimizer's state to the host model and Optimizer (checkpoints,
  // --save, replica checks), and back after the host state changed (broadcast, resume).
  void to_host();
  void from_host();
  // The channels of the images, and the input transform's per-channel mean and std replaced before
  // the first step (a resumed --normalize auto run goes on with the statistics it recorded); only
  // for an engine built with a normalisation of as many channels.
  int64_t channels() const { return eval_spec_.channels; }
  void set_normalization(const Normalization& normalize);
  // The backend's timed choices (Backend::conv_plan_choices), for checkpoints and resume.
  std::string conv_plan_choices() const { return be_.conv_plan_choices(); }
  void set_conv_plan_choices(const std::string& text) { be_.set_conv_plan_choices(text); }

 private:
  void stage_in(int64_t batch);
  void stage_out(int64_t batch);
  void forward_backward(bool sync, bool accumulate, Tracer* tracer);
  void count_training_forward();
  void update(bool first);
  void recorded_step(int64_t batch, int64_t step, bool first);
  bool all_ranks(bool mine, const char* what);
  void quiesce() { ddp_.reducer().transport().quiesce(); }
  Totals totals(int64_t first);

  const TrainConfig& cfg_;
  Communicator& comm_;
  Model& model_;
  Backend& be_;
  DataParallel& ddp_;
  Optimizer& opt_;
  const std::vector<DecayRange> decay_ranges_;
  const int64_t classes_, pixels_, batch_, eval_batch_;
  const float grad_scale_;
  const int uncaught_;
  // Backend memory. Data sets (views on a host backend), the epoch's indices and per-micro-batch
  // [loss, correct] totals; fixed addresses a recorded step reads and writes: its micro-batch's
  // indices, labels and totals, and the learning rate.
  DeviceArray<uint8_t> train_images_, test_images_;
  DeviceArray<Label> train_labels_, test_labels_;
  // The input transform: per-channel mean and std (empty without --normalize), the epoch's
  // augmentation draws (one per index of epoch_index_) and the staged micro-batch's.
  const AugmentSpec augment_;
  DeviceArray<float> mean_, std_;
  DeviceArray<uint32_t> epoch_draws_, step_draws_;
  ImageBatchSpec train_spec_, eval_spec_;
  std::vector<uint32_t> draws_host_;
  DeviceArray<int64_t> test_index_, epoch_index_, step_index_;
  DeviceArray<double> batch_stats_, step_stats_, eval_sums_;
  DeviceArray<double> grad_sumsq_,
      step_sumsq_;  // per step of the epoch; the fixed slot a step writes
  DeviceArray<int32_t> labels_, eval_labels_;
  // The learning rate; the optimizer's state: SGD's momentum, AdamW's moments and step count.
  DeviceArray<float> lr_, momentum_, exp_avg_, exp_avg_sq_;
  DeviceArray<double> adamw_step_;
  // The most any BatchNorm counter's float has counted since it was last folded into its int64
  // (ParamStore::fold_counters): 0 after from_host(), which folds them, then one more for every
  // training forward, each of which goes through step() (graph replays too).
  int64_t forwards_since_fold_ = 0;
  Tensor x_, dlogits_, eval_x_;
  std::unique_ptr<Recorder> step_graph_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Recorder>> eval_graphs_;  // by test range
  bool step_graphs_ = false, eval_graphs_on_ = false, replayed_ = false;
  // DPT_PROFILE_STEPS=A:B: global steps [A, B) inside Backend::profiler_window (-1: none).
  int64_t profile_from_ = -1, profile_to_ = -1;
  std::vector<int64_t> index_host_;
  std::vector<double> stats_host_;
  int64_t batches_ = 0, epoch_first_ = -1, step_first_ = -1, last_ = -1;
  ReducerStats stats_;
};

}  // namespace dpt
