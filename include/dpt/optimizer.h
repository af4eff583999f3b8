// The optimizer and its schedule: PyTorch's SGD over the flat buffers and the learning rate of
// every step (warm-up, then constant, step or cosine).
#pragma once

#include <cstdint>
#include <vector>

#include "dpt/config.h"

namespace dpt {

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

}  // namespace dpt
