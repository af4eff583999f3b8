// The recipe options (issue 32) through the StepEngine, on the gradients it computes: AdamW and
// Nesterov SGD steps against torch.optim's documented algorithms in double, --no-decay-bn-bias's
// parameter split (every 1-D parameter, read from the model's parameter list) and
// --label-smoothing's training loss (PyTorch's (1-e) CE + e U is linear in e; the test loss stays
// plain CE). The backend's operations alone are held to the same formulas in test_backend_ops.cc.
// One rank (an MPI singleton).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/gather.h"
#include "dpt/augment.h"
#include "dpt/dataset.h"
#include "dpt/engine.h"
#include "dpt/models.h"
#include "dpt/optimizer.h"
#include "dpt/sampler.h"
#include "engine_rig.h"
#include "test_util.h"

namespace dpt {
namespace {

// A LeNet EngineRig over a small synthetic data set, its epoch 0 begun.
struct RecipeRig {
  std::string dir = test::make_temp_dir("recipe");
  std::unique_ptr<test::EngineRig> rig;
  std::unique_ptr<ShardedSampler> sampler;
  explicit RecipeRig(const std::function<void(TrainConfig&)>& set) {
    test::write_synthetic_dataset(dir, 256, 64, 11);
    TrainConfig c = test::small_config("lenet", dir, 1, 32);
    set(c);
    rig = std::make_unique<test::EngineRig>(c);
    sampler = std::make_unique<ShardedSampler>(rig->train.n, c.batch_size, 0, 1, c.seed);
    rig->engine->begin_epoch(*sampler, sampler->steps_per_epoch());
  }
  ~RecipeRig() {
    rig.reset();
    std::filesystem::remove_all(dir);
  }
  ParamStore& store() { return rig->model->store(); }
  std::vector<float> params() {
    rig->engine->to_host();
    return {store().params(), store().params() + store().num_params()};
  }
  std::vector<float> grads() {
    store().grads_to_host();
    return {store().grads(), store().grads() + store().num_params()};
  }
  // The weight decay each element of the flat buffer takes: none for a 1-D parameter under
  // --no-decay-bn-bias, read from the parameter list here (not from decay_ranges).
  std::vector<double> decay_of(double wd) {
    std::vector<double> out(static_cast<size_t>(store().num_params()), wd);
    if (rig->cfg.no_decay_bn_bias)
      for (const Param& p : store().entries())
        if (!p.is_buffer && p.shape.size() == 1)
          std::fill_n(out.begin() + p.offset, p.numel(), 0.0);
    return out;
  }
};

// |got - ref| <= 1e-4 max|ref| element by element (ref: the step as the formula makes it).
void expect_steps(const std::vector<float>& after, const std::vector<float>& before,
                  const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(after.size(), ref.size());
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  ASSERT_GT(scale, 0) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = double{after[i]} - double{before[i]};
    if (std::fabs(got - ref[i]) > 1e-4 * scale && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " moved " << got << ", expected " << ref[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// torch.optim.AdamW(lr, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05) on LeNet, biases without
// decay: three steps at a changing rate, each compared with the documented algorithm applied to
// the gradients the engine computed; the moments and the step count carried in double.
TEST(Recipe, AdamwStepsFollowTorchOnTheEnginesGradients) {
  const double b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.05;
  RecipeRig r([&](TrainConfig& c) {
    c.optimizer = "adamw";
    c.momentum = 0;
    c.betas = {b1, b2};
    c.eps = eps;
    c.weight_decay = wd;
    c.no_decay_bn_bias = true;
  });
  const std::vector<double> decay = r.decay_of(wd);
  std::vector<double> m(decay.size()), v(decay.size());
  for (int s = 0; s < 3; ++s) {
    const double lr = 0.01 * (s + 1);
    const std::vector<float> before = r.params();
    r.rig->engine->step(s, s, lr, nullptr);
    const std::vector<float> after = r.params(), g = r.grads();
    const double t = s + 1, bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const double lr_f = static_cast<float>(lr);  // the rate travels as one float
    std::vector<double> step(decay.size());
    for (size_t i = 0; i < step.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * double{g[i]} * g[i];
      const double p = before[i] * (1 - lr_f * decay[i]);
      step[i] = p - lr_f / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps) - before[i];
    }
    expect_steps(after, before, step, "AdamW step " + std::to_string(s + 1));
  }
  EXPECT_EQ(r.rig->opt->adamw_step(), 3);
  EXPECT_EQ(r.rig->opt->steps(), 3);
  // The moments the engine kept are the formula's.
  double worst = 0, scale = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    worst = std::max(worst, std::fabs(r.rig->opt->exp_avg()[i] - m[i]));
    scale = std::max(scale, std::fabs(m[i]));
  }
  EXPECT_LE(worst, 1e-4 * scale);
}

// torch.optim.SGD(momentum=0.9, nesterov=True, weight_decay=5e-4): d = g + wd p, b = d then
// 0.9 b + d, p -= lr (d + 0.9 b).
TEST(Recipe, NesterovStepsFollowTorchOnTheEnginesGradients) {
  const double mu = 0.9, wd = 5e-4, lr = 0.05;
  RecipeRig r([&](TrainConfig& c) {
    c.momentum = mu;
    c.nesterov = true;
    c.weight_decay = wd;
  });
  std::vector<double> b;
  for (int s = 0; s < 3; ++s) {
    const std::vector<float> before = r.params();
    r.rig->engine->step(s, s, lr, nullptr);
    const std::vector<float> after = r.params(), g = r.grads();
    b.resize(g.size());
    std::vector<double> step(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double d = g[i] + static_cast<float>(wd) * double{before[i]};
      b[i] = s == 0 ? d : static_cast<float>(mu) * b[i] + d;
      step[i] = -static_cast<float>(lr) * (d + static_cast<float>(mu) * b[i]);
    }
    expect_steps(after, before, step, "Nesterov step " + std::to_string(s + 1));
  }
}

// --no-decay-bn-bias on SGD: with momentum 0, the first step moves a parameter by lr (g + wd p)
// when it decays and by lr g when it does not; a run without weight decay takes the same
// gradients (same start), so the difference is -lr wd p exactly where decay applies, and nothing
// on LeNet's four biases.
TEST(Recipe, NoDecayBnBiasSparesEveryOneDimensionalParameter) {
  const double wd = 0.5, lr = 0.1;
  RecipeRig plain([&](TrainConfig& c) {
    c.momentum = 0;
    c.weight_decay = 0;
  });
  RecipeRig split([&](TrainConfig& c) {
    c.momentum = 0;
    c.weight_decay = wd;
    c.no_decay_bn_bias = true;
  });
  const std::vector<float> p0 = plain.params();
  ASSERT_EQ(p0, split.params());
  plain.rig->engine->step(0, 0, lr, nullptr);
  split.rig->engine->step(0, 0, lr, nullptr);
  const std::vector<float> a = plain.params(), b = split.params();
  int spared = 0, decayed = 0;
  for (const Param& p : split.store().entries()) {
    if (p.is_buffer) continue;
    ++(p.shape.size() == 1 ? spared : decayed);
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
      const auto k = static_cast<size_t>(i);
      if (p.shape.size() == 1) {
        ASSERT_EQ(b[k], a[k]) << p.name << " decayed";
      } else {
        const double want = -static_cast<float>(lr) * static_cast<float>(wd) * double{p0[k]};
        ASSERT_NEAR(double{b[k]} - a[k], want, 1e-6 + 1e-3 * std::fabs(want))
            << p.name << "[" << i - p.offset << "]";
      }
    }
  }
  EXPECT_EQ(spared, 4);  // the biases of conv1, conv2, fc1 and fc2 (models.cc's LeNet)
  EXPECT_EQ(decayed, 4);
}

// decay_ranges on ResNet-18 (BatchNorm everywhere): the runs tile the buffer, and an element
// decays exactly when its parameter is not 1-D; without the flag, one run of everything.
TEST(Recipe, DecayRangesFollowTheParameterList) {
  auto model = make_model("resnet18", 10, cpu_backend());
  const ParamStore& st = model->store();
  const auto all = decay_ranges(st, false);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].begin, 0);
  EXPECT_EQ(all[0].end, st.num_params());
  EXPECT_TRUE(all[0].decay);
  const auto runs = decay_ranges(st, true);
  std::vector<int> decays(static_cast<size_t>(st.num_params()), -1);
  int64_t at = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].begin, at) << "run " << r;
    EXPECT_LT(runs[r].begin, runs[r].end) << "run " << r;
    if (r > 0) {
      EXPECT_NE(runs[r].decay, runs[r - 1].decay) << "runs " << r - 1 << " and " << r;
    }
    std::fill(decays.begin() + runs[r].begin, decays.begin() + runs[r].end, runs[r].decay);
    at = runs[r].end;
  }
  EXPECT_EQ(at, st.num_params());
  int bn = 0;
  for (const Param& p : st.entries()) {
    if (p.is_buffer) continue;
    bn +=
        p.name.find("bn") != std::string::npos || p.name.find("downsample.1") != std::string::npos;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i)
      ASSERT_EQ(decays[static_cast<size_t>(i)], p.shape.size() == 1 ? 0 : 1) << p.name;
  }
  EXPECT_GT(bn, 0);
}

// --label-smoothing e: the training loss of one step from the same start is PyTorch's
// (1-e) CE + e U, where CE and U (the cross-entropy against the uniform target, lse - mean_j z_j
// per row) are computed here in double from the model's own logits for that step's batch (the
// engine's input without normalisation or augmentation: byte / 255); the test loss is plain CE
// whatever e.
TEST(Recipe, LabelSmoothingMakesTheTrainingLossTorchs) {
  std::vector<double> loss, test_loss;
  double ce = 0, uniform = 0;  // summed over the batch, as the engine's totals are
  const std::vector<double> es = {0.0, 0.2, 0.4, 1.0};  // 1 (accepted, as torch does): U alone
  for (const double e : es) {
    RecipeRig r([&](TrainConfig& c) { c.label_smoothing = e; });
    if (e == 0.0) {
      const ImageSet& tr = r.rig->train;
      const int64_t batch = r.rig->cfg.batch_size, px = tr.pixels();
      ASSERT_EQ(tr.channels, 1);
      const int64_t* idx = r.sampler->local_indices(0);
      Tensor x({batch, tr.rows, tr.cols, 1});
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t p = 0; p < px; ++p)
          x.data()[b * px + p] =
              static_cast<float>(tr.images[static_cast<size_t>(idx[b] * px + p)]) / 255.f;
      const Tensor& z = r.rig->model->forward(x, Mode::kEval);  // LeNet: no BN, so as in training
      const int64_t k = z.shape()[1];
      for (int64_t b = 0; b < batch; ++b) {
        const float* zb = z.data() + b * k;
        const double mx = *std::max_element(zb, zb + k);
        double se = 0, sz = 0;
        for (int64_t j = 0; j < k; ++j) se += std::exp(zb[j] - mx), sz += zb[j];
        const double lse = mx + std::log(se);
        ce += lse - zb[tr.labels[static_cast<size_t>(idx[b])]];
        uniform += lse - sz / static_cast<double>(k);
      }
      ASSERT_GT(std::fabs(uniform - ce), 1e-2 * ce) << "U = CE: smoothing could not show";
    }
    test_loss.push_back(r.rig->engine->evaluate(0, 64).value().loss);
    r.rig->engine->step(0, 0, 0.05, nullptr);
    loss.push_back(r.rig->engine->step_totals().loss);
  }
  EXPECT_NEAR(loss[0], ce, 1e-5 * ce) << "e = 0: plain cross-entropy";
  for (size_t i = 1; i < loss.size(); ++i) {
    const double e = es[i];
    EXPECT_NEAR(loss[i], (1 - e) * ce + e * uniform, 1e-5 * ce) << "e = " << e;
    EXPECT_EQ(test_loss[0], test_loss[i]) << "e = " << e;
  }
}

// The engine's training batch under --augment crop,flip is each sampled image under its own draw:
// image_draw(seed, epoch, the image's index in the data set), applied by the CPU gather. The step's
// loss (LeNet: no BatchNorm, so the evaluation forward is the training one) equals the loss of that
// batch gathered here, in epochs 0 and 1, and differs from the plain batch's, so the draws show: a
// draw taken by the image's position in the batch, or the same in every epoch, moves it.
TEST(Augment, TheStepTrainsEachImageUnderItsOwnDrawOfTheEpoch) {
  RecipeRig r([](TrainConfig&) {});
  const AugmentSpec spec = parse_augment("crop,flip", 28, 28);
  ASSERT_TRUE(spec.crop && spec.flip && spec.pad == 3);
  test::EngineRig& rig = *r.rig;
  rig.engine.reset();
  rig.engine = std::make_unique<StepEngine>(rig.cfg, *rig.comm, *rig.model, *rig.ddp, *rig.opt,
                                            rig.train, rig.test, Normalization{}, spec);
  const ImageSet& tr = rig.train;
  const int64_t batch = rig.cfg.batch_size;
  for (int64_t epoch : {0, 1}) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    r.sampler->set_epoch(epoch);
    rig.engine->begin_epoch(*r.sampler, r.sampler->steps_per_epoch());
    const int64_t* idx = r.sampler->local_indices(0);
    std::vector<uint32_t> draws(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b)
      draws[static_cast<size_t>(b)] = image_draw(spec, rig.cfg.seed, epoch, idx[b]);
    // The batch's cross-entropy sum, with and without the draws, at the step's parameters.
    auto loss_of = [&](const uint32_t* d) {
      ImageBatchSpec is{tr.rows, tr.cols, tr.channels};
      is.pad = spec.pad;
      is.draws = d;
      Tensor x({batch, tr.rows, tr.cols, tr.channels});
      cpu::gather_transformed(tr.images.data(), tr.n, is, idx, batch, x.data());
      const Tensor& z = rig.model->forward(x, Mode::kEval);
      const int64_t k = z.shape()[1];
      double ce = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const float* zb = z.data() + b * k;
        const double mx = *std::max_element(zb, zb + k);
        double se = 0;
        for (int64_t j = 0; j < k; ++j) se += std::exp(zb[j] - mx);
        ce += mx + std::log(se) - zb[tr.labels[static_cast<size_t>(idx[b])]];
      }
      return ce;
    };
    rig.engine->to_host();
    const double want = loss_of(draws.data()), plain = loss_of(nullptr);
    ASSERT_GT(std::fabs(want - plain), 1e-3 * want) << "the draws do not change the loss";
    rig.engine->step(0, epoch, 0.05, nullptr);
    EXPECT_NEAR(rig.engine->step_totals().loss, want, 1e-5 * want);
  }
}

}  // namespace
}  // namespace dpt
