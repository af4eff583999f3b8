// The optimizer's host state and its schedule: SGD's momentum buffer or AdamW's two moment
// averages and step count, the number of steps taken, the learning rate of every step (warm-up,
// then constant, step or cosine), and which parameters weight decay applies to. The update itself
// is the backend's (Backend::sgd_update, Backend::adamw_update, run by the StepEngine).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/config.h"
#include "dpt/model_file.h"

namespace dpt {

class ParamStore;

// --scale-lr, the linear scaling rule (Goyal et al.): cfg.lr times the images of one optimizer
// step (--batch-size x --accum-steps, the images whose mean gradient the step takes) / 256, and at
// least one warm-up epoch. Applied once, before training (run_training).
void apply_scale_lr(TrainConfig* cfg);

// Learning rate of optimizer step `step` (0-based, counted over the whole run) with
// `steps_per_epoch` steps an epoch: linear warm-up over cfg.warmup_epochs (its step s at
// (s + 1) / (warmup_epochs x steps_per_epoch) of the peak, at most the peak: a warm-up of a
// fractional number of steps ends on the peak), then the schedule.
// cfg.lr is the peak rate (already scaled when --scale-lr is given). The same for every optimizer.
double learning_rate(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch);

// A run [begin, end) of the flat parameter buffer and whether weight decay applies to it.
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = true;
};
// The flat parameter buffer of `store` (finalized) cut into maximal runs by weight decay: one run
// [0, n) that decays without --no-decay-bn-bias; with it, no decay on every 1-D parameter
// (BatchNorm's weight and bias, every layer's bias), as the usual timm/Lightning parameter groups
// do. In buffer order, covering [0, num_params()) without gaps.
std::vector<DecayRange> decay_ranges(const ParamStore& store, bool no_decay_bn_bias);

// PyTorch's optimizers as far as the host keeps them, which the StepEngine mirrors in backend
// memory and checkpoints save and restore:
// - sgd (torch.optim.SGD): the momentum buffer of n parameters (empty without momentum); the
//   first step starts it at the gradient;
// - adamw (torch.optim.AdamW, amsgrad off): exp_avg and exp_avg_sq of n parameters each, zero at
//   the start, and the step count t of the bias corrections (the updates applied: a step the
//   non-finite guard skipped does not count, as a skipped optimizer.step() does not in PyTorch).
// steps() counts the optimizer steps taken (applied or skipped): the position checkpoints record.
class Optimizer {
 public:
  Optimizer(int64_t n, const TrainConfig& cfg);
  const std::string& name() const { return name_; }  // "sgd" | "adamw"
  bool adamw() const { return name_ == "adamw"; }
  std::vector<float>& momentum_buffer() { return buf_; }
  std::vector<float>& exp_avg() { return exp_avg_; }
  std::vector<float>& exp_avg_sq() { return exp_avg_sq_; }
  int64_t adamw_step() const { return adamw_step_; }
  void set_adamw_step(int64_t t) { adamw_step_ = t; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // The state as checkpoints store it (pointers into this object): sgd's
  // "optimizer.momentum_buffer" (shape [0] without momentum), adamw's "optimizer.exp_avg",
  // "optimizer.exp_avg_sq" and the counter "optimizer.step".
  OptimizerState state();

 private:
  std::string name_;
  std::vector<float> buf_, exp_avg_, exp_avg_sq_;
  int64_t adamw_step_ = 0;
  int64_t steps_ = 0;
};

}  // namespace dpt
