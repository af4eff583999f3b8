// The learning rate of every step (include/dpt/optimizer.h): linear warm-up, then constant, step or
// cosine.
#include "dpt/optimizer.h"

#include <algorithm>
#include <cmath>

namespace dpt {

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
