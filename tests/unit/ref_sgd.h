// A reference SGD on host buffers for tests: PyTorch's update (cpu::sgd_update, the CPU backend's
// kernel) with the momentum buffer and the step count that say whether a step is the first.
// Training itself updates through Backend::sgd_update in the StepEngine; Optimizer keeps only its
// state.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/ops.h"

namespace dpt::test {

// PyTorch's SGD: g += wd * p; buf = momentum * buf + g (buf = g on the first step); p -= lr * buf.
class RefSgd {
 public:
  // The buffer starts at a value the first step must ignore (PyTorch has none before it): an
  // update that used it would be off by lr * momentum * 1000.
  RefSgd(int64_t n, double momentum, double weight_decay)
      : n_(n),
        momentum_(momentum),
        weight_decay_(weight_decay),
        buf_(momentum > 0 ? n : 0, 1000.f) {}
  void step(float* params, const float* grads, double lr) {
    // PyTorch starts the momentum buffer at the first gradient.
    cpu::sgd_update(params, grads, buf_.data(), n_, static_cast<float>(lr),
                    static_cast<float>(momentum_), static_cast<float>(weight_decay_), steps_ == 0);
    ++steps_;
  }

 private:
  int64_t n_;
  double momentum_, weight_decay_;
  std::vector<float> buf_;
  int64_t steps_ = 0;
};

}  // namespace dpt::test
