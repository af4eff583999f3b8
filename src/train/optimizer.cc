// The optimizer's host state, which parameters decay, and the learning rate of every step
// (include/dpt/optimizer.h): linear warm-up, then constant, step or cosine.
#include "dpt/optimizer.h"

#include <algorithm>
#include <cmath>

#include "dpt/error.h"
#include "dpt/nn.h"

namespace dpt {

Optimizer::Optimizer(int64_t n, const TrainConfig& cfg) : name_(cfg.optimizer) {
  DPT_CHECK(name_ == "sgd" || name_ == "adamw", "unknown optimizer '" << name_ << "'");
  if (adamw()) {
    exp_avg_.assign(static_cast<size_t>(n), 0.f);
    exp_avg_sq_.assign(static_cast<size_t>(n), 0.f);
  } else if (cfg.momentum > 0) {
    buf_.assign(static_cast<size_t>(n), 0.f);
  }
}

OptimizerState Optimizer::state() {
  OptimizerState s;
  s.name = name_;
  if (adamw()) {
    s.buffers = {{"optimizer.exp_avg", &exp_avg_}, {"optimizer.exp_avg_sq", &exp_avg_sq_}};
    s.counters = {{"optimizer.step", &adamw_step_}};
  } else {
    s.buffers = {{"optimizer.momentum_buffer", &buf_}};
  }
  return s;
}

std::vector<DecayRange> decay_ranges(const ParamStore& store, bool no_decay_bn_bias) {
  const int64_t n = store.num_params();
  if (!no_decay_bn_bias) return {{0, n, true}};
  std::vector<DecayRange> params;
  for (const Param& p : store.entries())
    if (!p.is_buffer && p.numel() > 0)
      params.push_back({p.offset, p.offset + p.numel(), p.shape.size() != 1});
  std::sort(params.begin(), params.end(),
            [](const DecayRange& a, const DecayRange& b) { return a.begin < b.begin; });
  std::vector<DecayRange> runs;
  for (const DecayRange& r : params) {
    DPT_CHECK(r.begin == (runs.empty() ? 0 : runs.back().end),
              "the parameters do not tile the flat buffer at offset " << r.begin);
    if (!runs.empty() && runs.back().decay == r.decay)
      runs.back().end = r.end;
    else
      runs.push_back(r);
  }
  DPT_CHECK((runs.empty() ? 0 : runs.back().end) == n, "the parameters do not fill the buffer");
  return runs;
}

void apply_scale_lr(TrainConfig* c) {
  // Goyal et al.'s minibatch is the images of one update: with accumulation, --batch-size images
  // --accum-steps times (the gradient is their mean).
  c->lr *= static_cast<double>(c->batch_size * c->accum_steps) / 256.0;
  c->warmup_epochs = std::max(c->warmup_epochs, 1.0);
}

double learning_rate(const TrainConfig& c, int64_t step, int64_t spe) {
  const double t = static_cast<double>(step) / static_cast<double>(spe);
  if (c.warmup_epochs > 0 && t < c.warmup_epochs) {
    // Step `step` of the ramp reaches (step + 1) / ramp of the peak. A ramp of a fractional number
    // of steps (--warmup-epochs 0.3 at 4 steps an epoch: 1.2) has its last step past the ramp's
    // end: that step takes the peak, never more (it took 2 / 1.2 of it).
    const double done = static_cast<double>(step + 1),
                 ramp = c.warmup_epochs * static_cast<double>(spe);
    return done > ramp ? c.lr : c.lr * done / ramp;
  }
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
