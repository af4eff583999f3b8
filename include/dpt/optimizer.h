// The optimizer's host state and its schedule: SGD's momentum buffer and step count, and the
// learning rate of every step (warm-up, then constant, step or cosine). The update itself is the
// backend's (Backend::sgd_update, run by the StepEngine).
#pragma once

#include <cstdint>
#include <vector>

#include "dpt/config.h"

namespace dpt {

// Learning rate of optimizer step `step` (0-based, counted over the whole run) with
// `steps_per_epoch` steps an epoch: linear warm-up over cfg.warmup_epochs, then the schedule.
// cfg.lr is the peak rate (already scaled when --scale-lr is given).
double learning_rate(const TrainConfig& cfg, int64_t step, int64_t steps_per_epoch);

// PyTorch's SGD, as far as the host keeps it: the momentum buffer of n parameters (empty without
// momentum), which the StepEngine mirrors in backend memory and checkpoints save and restore, and
// the number of steps taken (the first one starts the buffer at the gradient).
class Sgd {
 public:
  Sgd(int64_t n, double momentum) : buf_(momentum > 0 ? n : 0) {}
  std::vector<float>& momentum_buffer() { return buf_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 private:
  std::vector<float> buf_;
  int64_t steps_ = 0;
};

}  // namespace dpt
