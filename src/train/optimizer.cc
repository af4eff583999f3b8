// The optimizer (include/dpt/optimizer.h): PyTorch's SGD over the flat buffers, and the learning
// rate of every step.
#include "dpt/optimizer.h"

#include <algorithm>
#include <cmath>

#include "cpu/ops.h"

namespace dpt {

void Sgd::step(float* p, const float* g, double lr) {
  // PyTorch starts the momentum buffer at the first gradient.
  cpu::sgd_update(p, g, buf_.data(), n_, static_cast<float>(lr), static_cast<float>(momentum_),
                  static_cast<float>(weight_decay_), steps_ == 0);
  ++steps_;
}

double learning_rate(const TrainConfig& c, int64_t step, int64_t spe) {
  const double t = static_cast<double>(step) / static_cast<double>(spe);
  if (c.warmup_epochs > 0 && t < c.warmup_epochs)
    return c.lr * static_cast<double>(step + 1) / (c.warmup_epochs * static_cast<double>(spe));
  if (c.schedule == "step") {
    double lr = c.lr;
    for (int e : c.step_epochs)
      if (t >= e) lr *= c.step_gamma;
    return lr;
  }
  if (c.schedule == "cosine") {
    const double span = std::max(1e-9, c.epochs - c.warmup_epochs);
    const double u = std::min(1.0, std::max(0.0, (t - c.warmup_epochs) / span));
    return c.lr * 0.5 * (1.0 + std::cos(M_PI * u));
  }
  return c.lr;
}

}  // namespace dpt
