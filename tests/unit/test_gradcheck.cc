// Finite-difference checks of every layer's backward (input and parameter gradients), the loss,
// whole models, the gradient-ready announcements and gradient accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/ops.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/tensor.h"
#include "test_util.h"

namespace dpt {
namespace {

using test::fill_uniform;
using test::random_tensor;

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data()[i]) * b.data()[i];
  return s;
}

// The on/off pattern of every ReLU a loss passes through, for kink detection.
using PatternFn = std::function<std::vector<uint8_t>()>;

struct CheckOpts {
  double eps = 1e-2;     // finite-difference step
  double rtol = 2e-3;    // per coordinate: |analytic - numeric| <= rtol * max(floor, |numeric|)
  double floor = 1.0;    // absolute floor of the scale above...
  double rel_floor = 0;  // ...or this fraction of the largest |numeric| in the sample, if larger
  int count = 40;        // coordinates checked (all when the tensor is smaller)
  // ReLU kinks inside [-eps, eps] spoil a central difference. With `pattern`, a coordinate where a
  // ReLU flips within the step is measured one-sided on a side where none does, else with a
  // quarter step (twice at most). Without it, `kinks` skips coordinates whose one-sided slopes
  // disagree.
  PatternFn pattern;
  bool kinks = false;
  double max_skip = 0.25;  // fraction of sampled coordinates that may be skipped at kinks
  double noise = 0;        // rounding noise of one loss evaluation: adds noise * sum|weights| of
                           // the difference formula (1/h central, 4/h one-sided) to the tolerance
  bool zero = false;       // the true gradient is 0 (a conv bias before train-mode BN)
  double l2 = 1e-2;        // bound on |analytic - numeric|_2 / |numeric|_2 over the sample
  uint64_t seed = 1;
  std::vector<int64_t> must;  // coordinates always checked
};

// Compares analytic[0..n) (the gradient of loss() w.r.t. data[0..n)) with central differences on
// a random subset of coordinates; data is perturbed in place and restored.
void check_gradient(const std::string& what, float* data, int64_t n,
                    const std::vector<float>& analytic, const std::function<double()>& loss,
                    const CheckOpts& o) {
  SCOPED_TRACE(what);
  ASSERT_EQ(static_cast<int64_t>(analytic.size()), n);
  std::vector<int64_t> idx;
  if (n <= o.count) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    std::mt19937_64 g(o.seed);
    idx = o.must;
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    while (static_cast<int>(idx.size()) < o.count) {
      const int64_t i = pick(g);
      if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
    }
  }
  const double l0 = loss();
  const std::vector<uint8_t> pattern0 = o.pattern ? o.pattern() : std::vector<uint8_t>{};
  struct Point {
    int64_t i;
    double numeric, fwd, bwd;
    bool skip;
    double slack = 0;  // tolerance for the evaluation noise
  };
  // The loss with data[i] moved by (about) step: the exact offset applied (that of the rounded
  // float), the loss, and whether every ReLU kept its state.
  struct Eval {
    double h, l;
    bool same;
  };
  auto at = [&](int64_t i, double step) {
    const float v = data[i];
    const float moved = static_cast<float>(v + step);
    data[i] = moved;
    const double l = loss();
    const bool same = !o.pattern || o.pattern() == pattern0;
    data[i] = v;
    return Eval{static_cast<double>(moved) - v, l, same};
  };
  std::vector<Point> pts;
  double max_num = 0;
  int adapted = 0;
  for (int64_t i : idx) {
    Point pt{i, 0, 0, 0, true, 0};
    double h = o.eps;
    for (int attempt = 0; attempt < (o.pattern ? 3 : 1) && pt.skip; ++attempt, h /= 4) {
      const Eval p = at(i, h), m = at(i, -h);
      if (p.same && m.same) {
        pt = {i,     (p.l - m.l) / (p.h - m.h), (p.l - l0) / p.h, (l0 - m.l) / -m.h,
              false, o.noise * 2 / (p.h - m.h)};
      } else {
        // A ReLU flips on one side: a three-point one-sided difference (exact for quadratics) on a
        // side where no ReLU flips over [0, 2h].
        for (const Eval& a : {p, m}) {
          if (!a.same) continue;
          const Eval b = at(i, 2 * a.h);
          if (!b.same) continue;
          const double w0 = -(1 / a.h + 1 / b.h), wa = b.h / (a.h * (b.h - a.h)),
                       wb = -a.h / (b.h * (b.h - a.h));
          const double num = w0 * l0 + wa * a.l + wb * b.l;
          pt = {i, num, num, num, false, o.noise * (std::fabs(w0) + std::fabs(wa) + std::fabs(wb))};
          break;
        }
      }
      adapted += !pt.skip && (attempt > 0 || !(p.same && m.same));
    }
    pts.push_back(pt);
    if (!pt.skip) max_num = std::max(max_num, std::fabs(pt.numeric));
  }
  const double floor = std::max(o.floor, o.rel_floor * max_num);
  int skipped = 0, checked = 0;
  double err2 = 0, num2 = 0, worst = 0;
  for (const Point& p : pts) {
    const double tol = o.rtol * std::max(floor, std::fabs(p.numeric)) + p.slack;
    if (p.skip || (o.kinks && std::fabs(p.fwd - p.bwd) > tol)) {
      ++skipped;
      continue;
    }
    const double a = analytic[static_cast<size_t>(p.i)];
    ++checked;
    err2 += (a - p.numeric) * (a - p.numeric);
    num2 += p.numeric * p.numeric;
    worst = std::max(worst, std::fabs(a - p.numeric) / tol);
    EXPECT_NEAR(a, p.numeric, tol) << "coordinate " << p.i;
  }
  // Skips must stay rare, and the gradient must not be trivially zero (unless it should be).
  EXPECT_LE(skipped, o.max_skip * static_cast<double>(pts.size()))
      << "too many coordinates skipped at kinks";
  EXPECT_GT(checked, 0);
  if (o.zero) {
    EXPECT_LT(max_num, 1e-3 * o.floor) << "expected a zero gradient";
  } else {
    EXPECT_GT(std::sqrt(num2), 1e-2 * o.floor) << "numeric gradient is ~0: the check means nothing";
    EXPECT_LT(std::sqrt(err2), o.l2 * std::sqrt(num2)) << "relative L2 error over the sample";
  }
  if (::testing::Test::HasFailure() || std::getenv("GRADCHECK_VERBOSE"))
    std::printf(
        "  %-36s n=%-7lld checked=%-3d adapted=%-2d skipped=%-2d max|num|=%-10.4g worst "
        "err/tol=%.3f\n",
        what.c_str(), static_cast<long long>(n), checked, adapted, skipped, max_num, worst);
}

// Test parameter values: BN gammas in [0.5, 1.5], running variances 1, other buffers 0, everything
// else in [-0.5, 0.5].
void init_params(ParamStore& st, std::mt19937_64& g) {
  for (Param& p : st.entries()) {
    const bool bn = p.name.find("bn") != std::string::npos;
    if (p.is_buffer) {
      std::fill(p.value.data(), p.value.data() + p.numel(),
                p.name.ends_with("running_var") ? 1.f : 0.f);
    } else if (bn && p.name.ends_with(".weight")) {
      fill_uniform(p.value.data(), p.numel(), g, 0.5f, 1.5f);
    } else {
      fill_uniform(p.value.data(), p.numel(), g, -0.5f, 0.5f);
    }
  }
}

// One layer under test: L = sum(y * r) for a fixed random r.
struct LayerCheck {
  ParamStore store;
  std::unique_ptr<Layer> layer;
  Mode mode = Mode::kTrain;
  Tensor x, y, r;

  LayerCheck(std::unique_ptr<Layer> l, const Shape& per_sample, int64_t n, uint64_t seed,
             const std::string& prefix, Mode m = Mode::kTrain, float xlo = -1.f, float xhi = 1.f)
      : layer(std::move(l)), mode(m) {
    std::mt19937_64 g(seed);
    const Shape out = layer->build(per_sample, store, prefix);
    store.finalize();
    init_params(store, g);
    Shape xs{n};
    xs.insert(xs.end(), per_sample.begin(), per_sample.end());
    x = random_tensor(xs, g, xlo, xhi);
    Shape ys{n};
    ys.insert(ys.end(), out.begin(), out.end());
    r = random_tensor(ys, g);
  }
  double loss() {
    Tensor out;
    layer->forward(x, out, mode);
    EXPECT_EQ(out.shape(), r.shape());
    return dot(out, r);
  }
  // Runs every check: dx and each parameter's gradient.
  void run(const std::string& what, CheckOpts o) {
    layer->forward(x, y, mode);
    ASSERT_EQ(y.shape(), r.shape());
    Tensor dx(x.shape());
    std::fill(dx.data(), dx.data() + dx.numel(), 7.f);  // backward must overwrite, not add
    for (Param& p : store.entries())
      if (!p.is_buffer) std::fill(p.grad.data(), p.grad.data() + p.numel(), -3.f);
    BackwardCtx ctx;
    layer->backward(x, y, r, &dx, ctx);
    ASSERT_EQ(dx.shape(), x.shape());
    std::vector<float> gx(dx.data(), dx.data() + dx.numel());
    std::vector<std::pair<Param*, std::vector<float>>> grads;
    for (Param& p : store.entries())
      if (!p.is_buffer)
        grads.emplace_back(&p, std::vector<float>(p.grad.data(), p.grad.data() + p.numel()));
    auto f = [this] { return loss(); };
    check_gradient(what + " dx", x.data(), x.numel(), gx, f, o);
    for (size_t k = 0; k < grads.size(); ++k) {
      Param* p = grads[k].first;
      const std::vector<float>& gp = grads[k].second;
      CheckOpts po = o;
      po.seed = o.seed + 17 * (k + 1);
      // A conv bias feeding a train-mode BatchNorm is cancelled by the mean subtraction.
      po.zero = p->name.ends_with("conv1.bias") || p->name.ends_with("conv2.bias");
      check_gradient(what + " " + p->name, p->value.data(), p->numel(), gp, f, po);
    }
  }
};

// ---- Layers
// ----------------------------------------------------------------------------------------

TEST(GradCheck, Conv2d3x3) {
  LayerCheck c(make_conv2d(4, 3), {6, 5, 3}, 2, 101, "conv");
  c.run("conv k3", {});
}

TEST(GradCheck, Conv2d3x3Winograd) {
  // 16 channels in and out: the stride-1 3x3 shape that runs the Winograd path
  // (src/cpu/winograd.h).
  LayerCheck c(make_conv2d(16, 3, 1, 1), {5, 6, 16}, 2, 106, "conv");
  c.run("conv k3 winograd", {});
}

TEST(GradCheck, Conv2dStride2Pad1) {
  // 7x8 input: stride 2 with pad 1 leaves the last column out of every window on one side.
  LayerCheck c(make_conv2d(5, 3, 2, 1), {7, 8, 3}, 2, 102, "conv");
  c.run("conv k3 s2 p1", {});
}

TEST(GradCheck, Conv2d1x1Stride2) {
  LayerCheck c(make_conv2d(6, 1, 2, 0), {7, 7, 4}, 2, 103, "conv");
  c.run("conv 1x1 s2", {});
}

TEST(GradCheck, Conv2d5x5NoBias) {
  LayerCheck c(make_conv2d(3, 5, 1, 2, false), {6, 6, 2}, 2, 104, "conv");
  c.run("conv k5 p2 nobias", {});
}

TEST(GradCheck, BatchNorm2dTrain) {
  LayerCheck c(make_batchnorm2d(), {4, 3, 3}, 3, 105, "bn");
  // Shift and scale the input channels so the statistics are far from (0, 1).
  for (int64_t i = 0; i < c.x.numel(); ++i) c.x.data()[i] = 2.f * c.x.data()[i] + 0.5f * (i % 3);
  c.run("bn train", {});
}

TEST(GradCheck, BatchNorm2dEval) {
  // Eval mode: running statistics are constants, so dx = dy * gamma / sqrt(running_var + eps).
  LayerCheck c(make_batchnorm2d(), {4, 3, 3}, 3, 107, "bn", Mode::kEval);
  c.run("bn eval", {});
}
TEST(GradCheck, BatchNorm2dTrainThreeRows) {
  // 3 rows per channel: strongly non-linear (with 2 rows the output would not depend on x).
  LayerCheck c(make_batchnorm2d(), {1, 1, 5}, 3, 106, "bn");
  CheckOpts o;
  o.eps = 1e-3;
  c.run("bn train 3 rows", o);
}

// BatchNorm2d+ReLU: the ReLU's kinks follow the normalised values, which every input moves in
// training mode, so they cannot be kept out of the step; the pattern (the output's sign) lets
// check_gradient measure one-sided where a ReLU flips.
void check_bn_relu(const std::string& what, Mode mode, uint64_t seed) {
  LayerCheck c(make_batchnorm2d_relu(), {4, 3, 3}, 3, seed, "bn", mode);
  for (int64_t i = 0; i < c.x.numel(); ++i) c.x.data()[i] = 2.f * c.x.data()[i] + 0.5f * (i % 3);
  CheckOpts o;
  o.pattern = [&c] {
    Tensor y;
    c.layer->forward(c.x, y, c.mode);
    std::vector<uint8_t> on(static_cast<size_t>(y.numel()));
    for (int64_t i = 0; i < y.numel(); ++i) on[static_cast<size_t>(i)] = y.data()[i] > 0.f;
    return on;
  };
  const std::vector<uint8_t> on = o.pattern();
  const auto active = std::count(on.begin(), on.end(), 1);
  EXPECT_GT(active, static_cast<int64_t>(on.size()) / 5);  // both states of the ReLU are present
  EXPECT_LT(active, static_cast<int64_t>(on.size()) * 4 / 5);
  o.noise = 1e-6;
  o.max_skip = 0.5;
  c.run(what, o);
}

TEST(GradCheck, BatchNorm2dReluTrain) { check_bn_relu("bn+relu train", Mode::kTrain, 118); }

TEST(GradCheck, BatchNorm2dReluEval) { check_bn_relu("bn+relu eval", Mode::kEval, 119); }

TEST(GradCheck, ReLU) {
  LayerCheck c(make_relu(), {3, 4, 5}, 2, 107, "");
  // Keep inputs at least 0.1 away from the kink, both signs present.
  for (int64_t i = 0; i < c.x.numel(); ++i) {
    float& v = c.x.data()[i];
    v = (v < 0 ? -0.1f : 0.1f) + 0.9f * v;
  }
  c.run("relu", {});
}

TEST(GradCheck, ReluAvgPool2dFused) {
  // Inputs kept away from the ReLU kink (|x| >= 0.1) so central differences are exact.
  CheckOpts o;
  o.count = 1000;
  LayerCheck c(make_relu_avgpool2d(2, 2), {5, 7, 3}, 2, 111, "");
  for (int64_t i = 0; i < c.x.numel(); ++i) c.x.data()[i] += c.x.data()[i] >= 0 ? 0.1f : -0.1f;
  c.run("relu+avgpool 2/2", o);
  LayerCheck d(make_relu_avgpool2d(3, 1), {5, 4, 2}, 2, 112, "");
  for (int64_t i = 0; i < d.x.numel(); ++i) d.x.data()[i] += d.x.data()[i] >= 0 ? 0.1f : -0.1f;
  d.run("relu+avgpool 3/1", o);
}
TEST(GradCheck, AvgPool2d) {
  LayerCheck c(make_avgpool2d(2, 2), {5, 7, 3}, 2, 108, "");  // odd sizes: floor drops a row/col
  CheckOpts o;
  o.count = 1000;  // every coordinate, including the uncovered ones (gradient 0)
  c.run("avgpool 2/2", o);
  LayerCheck d(make_avgpool2d(3, 1), {5, 4, 2}, 2, 109, "");  // overlapping windows
  d.run("avgpool 3/1", o);
}

TEST(GradCheck, MaxPool2d) {
  // Distinct inputs 0.05 apart (a shuffled ramp), so no window's winner changes within the step
  // of 1e-2 and the central differences see a linear function: dL/dx is r at each winner (summed
  // over the windows it wins), 0 elsewhere.
  for (const auto& [k, s, pad] : {std::tuple{3, 2, 1}, std::tuple{2, 2, 0}, std::tuple{3, 1, 1}}) {
    LayerCheck c(make_maxpool2d(k, s, pad), {7, 6, 3}, 2, 120 + k + s, "");
    std::vector<float> ramp(static_cast<size_t>(c.x.numel()));
    for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = -3.f + 0.05f * static_cast<float>(i);
    std::shuffle(ramp.begin(), ramp.end(), std::mt19937_64(k * 10 + s));
    std::copy(ramp.begin(), ramp.end(), c.x.data());
    CheckOpts o;
    o.count = 1000;  // every coordinate: the winners and the positions that win nothing
    c.run("maxpool " + std::to_string(k) + "/" + std::to_string(s) + "/" + std::to_string(pad), o);
  }
}
TEST(GradCheck, GlobalAvgPool) {
  LayerCheck c(make_global_avgpool(), {3, 4, 5}, 2, 110, "");
  c.run("global avgpool", {});
}

TEST(GradCheck, Flatten) {
  LayerCheck c(make_flatten(), {2, 3, 4}, 2, 111, "");
  CheckOpts o;
  o.count = 1000;
  c.run("flatten", o);
}

TEST(GradCheck, Linear) {
  LayerCheck c(make_linear(7), {13}, 4, 112, "fc");
  c.run("linear", {});
  LayerCheck d(make_linear(5, false), {9}, 3, 113, "fc");
  d.run("linear nobias", {});
}

// The same computation as a Residual block, from separate layers whose intermediate outputs are
// visible: gives the on/off pattern of the block's two ReLUs for the block's current parameters
// (copied over by name) and input.
struct ResidualShadow {
  ParamStore store;
  std::unique_ptr<Layer> conv1, bn1 = make_batchnorm2d(), conv2, bn2 = make_batchnorm2d(), ds;
  Tensor a, b, d, e, sc;
  ResidualShadow(int64_t channels, bool use_1x1, int64_t stride, const Shape& in)
      : conv1(make_conv2d(channels, 3, stride, 1)), conv2(make_conv2d(channels, 3, 1, 1)) {
    Shape s = conv1->build(in, store, "conv1");
    s = bn1->build(s, store, "bn1");
    s = conv2->build(s, store, "conv2");
    bn2->build(s, store, "bn2");
    if (use_1x1) {
      ds = make_conv2d(channels, 1, stride, 0);
      ds->build(in, store, "downsample");
    }
    store.finalize();
  }
  std::vector<uint8_t> pattern(ParamStore& block, const std::string& prefix, const Tensor& x) {
    for (Param& p : store.entries()) {
      const Param* q = block.find(prefix + "." + p.name);
      std::copy(q->value.data(), q->value.data() + q->numel(), p.value.data());
    }
    conv1->forward(x, a, Mode::kTrain);
    bn1->forward(a, b, Mode::kTrain);
    std::vector<uint8_t> on(static_cast<size_t>(2 * b.numel()));
    for (int64_t i = 0; i < b.numel(); ++i) {
      on[static_cast<size_t>(i)] = b.data()[i] > 0.f;
      b.data()[i] = std::max(b.data()[i], 0.f);
    }
    conv2->forward(b, d, Mode::kTrain);
    bn2->forward(d, e, Mode::kTrain);
    const Tensor* skip = &x;
    if (ds) {
      ds->forward(x, sc, Mode::kTrain);
      skip = &sc;
    }
    for (int64_t i = 0; i < e.numel(); ++i)
      on[static_cast<size_t>(b.numel() + i)] = e.data()[i] + skip->data()[i] > 0.f;
    return on;
  }
};

void check_residual(const std::string& what, int64_t channels, bool use_1x1, int64_t stride,
                    const Shape& in, uint64_t seed) {
  LayerCheck c(make_residual(channels, use_1x1, stride), in, 2, seed, "blk");
  ResidualShadow shadow(channels, use_1x1, stride, in);
  // The shadow reproduces the block (same layers), and its pattern has both states of each ReLU.
  Tensor y;
  c.layer->forward(c.x, y, Mode::kTrain);
  const std::vector<uint8_t> on = shadow.pattern(c.store, "blk", c.x);
  const int64_t half = static_cast<int64_t>(on.size()) / 2;
  ASSERT_EQ(half, y.numel());
  for (int64_t i = 0; i < y.numel(); ++i)
    ASSERT_EQ(y.data()[i] > 0.f, on[static_cast<size_t>(half + i)] != 0) << i;
  for (int part = 0; part < 2; ++part) {
    const auto first = on.begin() + part * half, last = first + half;
    EXPECT_GT(std::count(first, last, 1), half / 5) << part;
    EXPECT_GT(std::count(first, last, 0), half / 5) << part;
  }
  CheckOpts o;
  o.count = 30;
  o.pattern = [&] { return shadow.pattern(c.store, "blk", c.x); };
  o.noise = 2e-6;  // measured: ~1e-6 on these losses (sums of ~200 float outputs of size ~1)
  o.max_skip = 0.5;
  c.run(what, o);
}

TEST(GradCheck, ResidualWith1x1) {
  // 8 input channels: see the oneDNN note in the report (1x1 stride-2 backward-weights on avx2
  // writes out of bounds for fewer than 8 input channels).
  check_residual("residual 1x1 s2", 4, true, 2, {6, 6, 8}, 114);
}

TEST(GradCheck, ResidualWith1x1Stride1) {
  check_residual("residual 1x1 s1", 6, true, 1, {5, 5, 3}, 117);
}

TEST(GradCheck, ResidualIdentity) {
  check_residual("residual identity", 4, false, 1, {5, 5, 4}, 115);
}

TEST(GradCheck, ResidualParamGradsDoNotNeedDx) {
  // The first block of a network gets no dx; its parameter gradients must not change.
  for (bool shortcut : {true, false}) {
    LayerCheck c(make_residual(shortcut ? 8 : 4, shortcut, shortcut ? 2 : 1),
                 {6, 6, shortcut ? 8 : 4}, 2, 116, "blk");
    c.layer->forward(c.x, c.y, Mode::kTrain);
    BackwardCtx ctx;
    Tensor dx;
    c.layer->backward(c.x, c.y, c.r, &dx, ctx);
    std::vector<float> with(c.store.grads(), c.store.grads() + c.store.num_params());
    c.store.zero_grads();
    c.layer->forward(c.x, c.y, Mode::kTrain);  // a backward hands the activations back
    c.layer->backward(c.x, c.y, c.r, nullptr, ctx);
    for (int64_t i = 0; i < c.store.num_params(); ++i)
      ASSERT_EQ(c.store.grads()[i], with[static_cast<size_t>(i)])
          << "shortcut=" << shortcut << " " << i;
  }
}

// ---- The gradient pool
// ------------------------------------------------------------------------------

TEST(TensorPool, LendsTheBestFitElseTheLargestInAFixedOrder) {
  TensorPool pool;
  EXPECT_TRUE(pool.take(100).empty());  // nothing to lend: the caller's resize allocates
  // Capacities 256, 512 and 1024 bytes (64, 128 and 256 floats), given out of order.
  Tensor a({256}), b({64}), c({128});
  const void *pa = a.data(), *pb = b.data(), *pc = c.data();
  pool.give(std::move(a));
  pool.give(std::move(b));
  pool.give(std::move(c));
  float host[4] = {};
  pool.give(Tensor::view(host, {4}));  // a view is not the pool's to lend
  pool.give(Tensor());                 // nor is an empty tensor
  EXPECT_EQ(pool.free_buffers(), 3u);
  Tensor t1 = pool.take(300);  // the smallest that fits: 512
  EXPECT_EQ(static_cast<const void*>(t1.data()), pc);
  Tensor t2 = pool.take(2000);  // none fits: the largest, for the caller to grow
  EXPECT_EQ(static_cast<const void*>(t2.data()), pa);
  Tensor t3 = pool.take(0);
  EXPECT_EQ(static_cast<const void*>(t3.data()), pb);
  EXPECT_EQ(pool.free_buffers(), 0u);
  // Given back in any order, they are lent again in the same one.
  pool.give(std::move(t2));
  pool.give(std::move(t3));
  pool.give(std::move(t1));
  EXPECT_EQ(static_cast<const void*>(pool.take(1).data()), pb);
  EXPECT_EQ(static_cast<const void*>(pool.take(1).data()), pc);
  EXPECT_EQ(static_cast<const void*>(pool.take(1).data()), pa);
}

// Five ReLUs over {4, 4, 3}: the chain whose borrowed buffers the pool tests count.
struct ReluChain {
  Sequential seq;
  ParamStore store;
  ReluChain() {
    for (int i = 0; i < 5; ++i) seq.add("", make_relu());
    seq.build({4, 4, 3}, store, "");
    store.finalize();
  }
};

TEST(TensorPool, AChainBorrowsItsActivationsAndGradientsAndTheNextStepAllocatesNothing) {
  // Forward borrows the four activations between the five children and keeps them; backward
  // borrows the gradients, no more than two out at once (the one a child reads, the one it
  // writes), and hands every buffer back once its last reader is done.
  ReluChain chain;
  Sequential& seq = chain.seq;
  std::mt19937_64 g(5);
  Tensor x = random_tensor({2, 4, 4, 3}, g), y({2, 4, 4, 3}), dy = random_tensor({2, 4, 4, 3}, g),
         dx({2, 4, 4, 3});
  const int64_t act = 2 * 4 * 4 * 3 * 4;  // one activation's bytes (384: already 64-aligned)
  TensorPool pool;
  seq.set_pool(&pool);
  BackwardCtx ctx;
  const int64_t before = Tensor::live_bytes();
  seq.forward(x, y, Mode::kTrain);
  EXPECT_EQ(Tensor::live_bytes() - before, 4 * act);
  EXPECT_EQ(pool.free_buffers(), 0u);
  seq.backward(x, y, dy, &dx, ctx);
  // At the second child from the top: four activations and two gradients out at once.
  EXPECT_EQ(Tensor::live_bytes() - before, 6 * act);
  EXPECT_EQ(pool.free_buffers(), 6u);
  // dL/dx of five ReLUs: dy where x > 0, else 0.
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(dx.data()[i], x.data()[i] > 0 ? dy.data()[i] : 0.f) << i;
  // What was handed back is not there for a second backward (PyTorch refuses one too).
  EXPECT_THROW(seq.backward(x, y, dy, &dx, ctx), Error);
  seq.forward(x, y, Mode::kTrain);
  seq.backward(x, y, dy, &dx, ctx);
  EXPECT_EQ(Tensor::live_bytes() - before, 6 * act);
  EXPECT_EQ(pool.free_buffers(), 6u);
}

// A layer that passes its input through, or throws from forward or backward when armed: the
// failure of a child part-way through a composite's call.
struct Tripwire : Layer {
  bool fail_forward = false, fail_backward = false;
  std::string kind() const override { return "Tripwire"; }
  Shape build(const Shape& in, ParamStore&, const std::string&) override { return in; }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    if (fail_forward) throw Error(ErrorKind::kInput, "tripwire forward");
    y.resize(x.shape());
    std::copy(x.data(), x.data() + x.numel(), y.data());
  }
  void backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx, BackwardCtx&) override {
    if (fail_backward) throw Error(ErrorKind::kInput, "tripwire backward");
    dx->resize(dy.shape());
    std::copy(dy.data(), dy.data() + dy.numel(), dx->data());
  }
};

TEST(TensorPool, AChildThatThrowsLeavesEveryBorrowedBufferWithThePool) {
  // A child's exception part-way through forward or backward hands the composite's loans back
  // (Loan): the pool keeps every buffer it grew, nothing is freed, and the next step allocates
  // nothing (on the GPU, a capture that fails no longer costs buffers either).
  Sequential seq;
  Tripwire* wire = nullptr;
  for (int i = 0; i < 5; ++i) {
    if (i == 2) {
      auto t = std::make_unique<Tripwire>();
      wire = t.get();
      seq.add("", std::move(t));
    } else {
      seq.add("", make_relu());
    }
  }
  ParamStore store;
  seq.build({4, 4, 3}, store, "");
  store.finalize();
  std::mt19937_64 g(7);
  Tensor x = random_tensor({2, 4, 4, 3}, g), y({2, 4, 4, 3}), dy = random_tensor({2, 4, 4, 3}, g),
         dx({2, 4, 4, 3});
  TensorPool pool;
  seq.set_pool(&pool);
  BackwardCtx ctx;
  seq.forward(x, y, Mode::kTrain);
  seq.backward(x, y, dy, &dx, ctx);
  ASSERT_EQ(pool.free_buffers(), 6u);  // as ReluChain's: four activations, two gradients
  const int64_t settled = Tensor::live_bytes();
  // Forward fails at child 2, having borrowed three buffers and kept child 0's output: the two
  // in flight go back at once, the kept one at the next forward.
  wire->fail_forward = true;
  EXPECT_THROW(seq.forward(x, y, Mode::kTrain), Error);
  EXPECT_EQ(Tensor::live_bytes(), settled);
  EXPECT_EQ(pool.free_buffers(), 5u);
  EXPECT_THROW(seq.backward(x, y, dy, &dx, ctx), Error);  // refused: nothing was kept
  wire->fail_forward = false;
  seq.forward(x, y, Mode::kTrain);
  EXPECT_EQ(pool.free_buffers(), 2u);  // four activations kept again, from the same buffers
  // Backward fails at child 2, with the gradient it reads and the one it writes out.
  wire->fail_backward = true;
  EXPECT_THROW(seq.backward(x, y, dy, &dx, ctx), Error);
  EXPECT_EQ(Tensor::live_bytes(), settled);
  wire->fail_backward = false;
  seq.forward(x, y, Mode::kTrain);
  seq.backward(x, y, dy, &dx, ctx);
  EXPECT_EQ(Tensor::live_bytes(), settled);
  EXPECT_EQ(pool.free_buffers(), 6u);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(dx.data()[i], x.data()[i] > 0 ? dy.data()[i] : 0.f) << i;
}

TEST(TensorPool, InferenceBorrowsTwoBuffersForAChainAndKeepsNothing) {
  ReluChain chain;
  Sequential& seq = chain.seq;
  TensorPool pool;
  seq.set_pool(&pool);
  std::mt19937_64 g(6);
  Tensor x = random_tensor({2, 4, 4, 3}, g), y;
  const int64_t act = 2 * 4 * 4 * 3 * 4;
  const int64_t before = Tensor::live_bytes();
  seq.forward(x, y, Mode::kInfer);
  // y, and the two intermediates out at once (what child i reads, what it writes), borrowed.
  EXPECT_EQ(Tensor::live_bytes() - before, 3 * act);
  EXPECT_EQ(pool.free_buffers(), 2u);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(y.data()[i], std::max(x.data()[i], 0.f)) << i;
  BackwardCtx ctx;
  Tensor dx;
  EXPECT_THROW(seq.backward(x, y, y, &dx, ctx), Error);
  // kEval keeps all four intermediates for a backward, as kTrain does: the two in the pool and
  // two more.
  seq.forward(x, y, Mode::kEval);
  EXPECT_EQ(Tensor::live_bytes() - before, 3 * act + 2 * act);
  EXPECT_EQ(pool.free_buffers(), 0u);
  EXPECT_NO_THROW(seq.backward(x, y, y, &dx, ctx));
}

// Every buffer between the layers comes from the one pool and goes back to it. Blocks of one shape
// keep 3 activations each (two inside, the branch output) and the chain keeps those between
// blocks; backward adds only what the topmost block has out at once, whatever the depth: dmid, dz,
// dmain, the two gradients inside its branch and, with more than one block, the chain's gradient
// of the block below. The lower blocks' gradients reuse buffers handed back above them. (Where the
// largest gradients are out lower down than same-sized activations, as in ResNet-50's stem, the
// pool then needs fewer buffers than activations and gradients held apart: docs/PERFORMANCE.md.)
TEST(TensorPool, GradientsReuseTheActivationsBackwardHasPassed) {
  auto build = [](int blocks) {
    auto seq = std::make_unique<Sequential>();
    for (int b = 0; b < blocks; ++b) seq->add(std::to_string(b), make_residual(4, false, 1));
    return seq;
  };
  for (int blocks : {1, 8}) {
    SCOPED_TRACE(blocks);
    LayerCheck c(build(blocks), {5, 5, 4}, 2, 9, "net");
    const int64_t alloc = (2 * 5 * 5 * 4 * 4 + 63) / 64 * 64;  // 800 bytes, allocated as 832
    TensorPool pool;
    c.layer->visit([&](Layer& l) { set_pool(l, &pool); });
    Tensor dx({2, 5, 5, 4});
    c.layer->forward(c.x, c.y, Mode::kTrain);
    const int64_t kept = Tensor::live_bytes();
    BackwardCtx ctx;
    c.layer->backward(c.x, c.y, c.r, &dx, ctx);
    const int out_at_once = blocks > 1 ? 6 : 5;
    EXPECT_EQ(pool.free_buffers(), static_cast<size_t>(3 * blocks + (blocks - 1) + out_at_once));
    EXPECT_EQ(Tensor::live_bytes() - kept, out_at_once * alloc);
  }
}

TEST(TensorPool, InferenceGivesEvalsLogitsBitForBitAndRefusesABackward) {
  for (const char* name : {"resnet18", "resnet50"}) {
    SCOPED_TRACE(name);
    auto m = make_model(name, 10, cpu_backend(), {8, 8, 3});
    m->init_parameters("kaiming", 3);
    std::mt19937_64 g(7);
    Tensor x = random_tensor({3, 8, 8, 3}, g), dl = random_tensor({3, 10}, g);
    BackwardCtx ctx;
    m->forward(x, Mode::kTrain);  // running statistics move off their initial values
    m->backward(dl, ctx);
    const Tensor& e = m->forward(x, Mode::kEval);
    const std::vector<float> want(e.data(), e.data() + e.numel());
    const Tensor& got = m->forward(x, Mode::kInfer);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got.data()[i]), std::bit_cast<uint32_t>(want[i])) << i;
    EXPECT_THROW(m->backward(dl, ctx), Error);
  }
}

TEST(TensorPool, TrainingAndLargerEvaluationsSettleAndThenAllocateNothing) {
  // Evaluation at 16 images borrows from the pool that training's backward at 4 uses: after a
  // round of each, further rounds allocate nothing (a GPU step's CUDA graph stays valid).
  auto m = make_model("resnet18", 10, cpu_backend(), {8, 8, 3});
  m->init_parameters("kaiming", 4);
  std::mt19937_64 g(8);
  Tensor xt = random_tensor({4, 8, 8, 3}, g), dl = random_tensor({4, 10}, g);
  Tensor xe = random_tensor({16, 8, 8, 3}, g);
  BackwardCtx ctx;
  auto round = [&] {
    m->forward(xt, Mode::kTrain);
    m->backward(dl, ctx);
    m->forward(xe, Mode::kInfer);
  };
  round();
  round();
  const int64_t live = Tensor::live_bytes();
  for (int i = 0; i < 3; ++i) {
    round();
    EXPECT_EQ(Tensor::live_bytes(), live) << "round " << i + 3;
  }
}

TEST(TensorPool, AForwardThatThrowsLeavesBackwardRefused) {
  // A forward refused for its input's shape must not leave the activations of the forward before
  // it looking kept: a backward would pair them with the new call's tensors. A residual block
  // alone, and inside a Sequential.
  auto block = [] { return make_basic_block(4, 1, false, false); };
  for (bool wrapped : {false, true}) {
    SCOPED_TRACE(wrapped ? "in a Sequential" : "a block");
    std::unique_ptr<Layer> layer = block();
    if (wrapped) {
      auto seq = std::make_unique<Sequential>();
      seq->add("0", std::move(layer));
      layer = std::move(seq);
    }
    LayerCheck c(std::move(layer), {5, 5, 4}, 2, 3, "blk");
    c.layer->forward(c.x, c.y, Mode::kTrain);
    BackwardCtx ctx;
    Tensor dx;
    EXPECT_NO_THROW(c.layer->backward(c.x, c.y, c.r, &dx, ctx));
    Tensor bad({2, 5, 5, 3}), out;
    EXPECT_THROW(c.layer->forward(bad, out, Mode::kTrain), Error);
    EXPECT_THROW(c.layer->backward(c.x, c.y, c.r, &dx, ctx), Error);
  }
}

TEST(TensorPool, BorrowedGradientsAreOverwrittenNeverRead) {
  // A pool whose buffers are full of NaN (what a lent buffer held before is anything) must give
  // the same bits as fresh zeroed ones: no forward may read the activation it is about to write,
  // no backward the gradient.
  struct Block {
    const char* what;
    std::function<std::unique_ptr<Layer>()> make;
    Shape in;
  };
  const std::vector<Block> blocks{
      {"d2l residual 1x1", [] { return make_residual(8, true, 2); }, {6, 6, 8}},
      {"d2l residual identity", [] { return make_residual(4, false, 1); }, {5, 5, 4}},
      {"basic block", [] { return make_basic_block(4, 2, true, false); }, {6, 6, 8}},
      {"bottleneck", [] { return make_bottleneck(2, 2, true, false); }, {6, 6, 8}}};
  for (const Block& b : blocks) {
    std::vector<float> want_dx, want_grads;
    for (bool dirty : {false, true}) {
      LayerCheck c(b.make(), b.in, 2, 131, "blk");
      TensorPool pool;
      if (dirty)
        for (int copy = 0; copy < 2; ++copy)
          for (int64_t n : {40, 200, 600, 1200, 2400, 4800}) {
            Tensor t({n}, &cpu_backend());  // the layers' backend: lent as it is, not reallocated
            std::fill(t.data(), t.data() + n, std::nanf(""));
            pool.give(std::move(t));
          }
      c.layer->visit([&](Layer& l) { set_pool(l, &pool); });
      c.layer->forward(c.x, c.y, Mode::kTrain);
      BackwardCtx ctx;
      Tensor dx;
      c.layer->backward(c.x, c.y, c.r, &dx, ctx);
      std::vector<float> got_dx(dx.data(), dx.data() + dx.numel());
      got_dx.insert(got_dx.end(), c.y.data(), c.y.data() + c.y.numel());  // and the output
      std::vector<float> got_grads(c.store.grads(), c.store.grads() + c.store.num_params());
      if (!dirty) {
        want_dx = got_dx;
        want_grads = got_grads;
        continue;
      }
      // The layers did borrow the NaN buffers (set_pool reached them): some were overwritten.
      int written = 0;
      for (size_t left = pool.free_buffers(); left > 0; --left) {
        Tensor t = pool.take(0);
        written += std::any_of(t.data(), t.data() + t.numel(), [](float v) { return v == v; });
      }
      EXPECT_GT(written, 0) << b.what;
      for (size_t i = 0; i < want_dx.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got_dx[i]), std::bit_cast<uint32_t>(want_dx[i]))
            << b.what << " dx, then y: " << i;
      for (size_t i = 0; i < want_grads.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got_grads[i]), std::bit_cast<uint32_t>(want_grads[i]))
            << b.what << " parameter gradient " << i;
    }
  }
}

// ---- Loss
// ------------------------------------------------------------------------------------------

TEST(GradCheck, SoftmaxXent) {
  std::mt19937_64 g(120);
  const int64_t n = 4, k = 5;
  Tensor z = random_tensor({n, k}, g, -2.f, 2.f);
  const int32_t labels[n] = {0, 3, 4, 3};
  std::vector<float> d(static_cast<size_t>(n * k));
  cpu::softmax_xent(z.data(), labels, n, k, 1.f / n, d.data(), nullptr);
  auto mean_loss = [&] {
    return cpu::softmax_xent(z.data(), labels, n, k, 1.f, nullptr, nullptr) / n;
  };
  CheckOpts o;
  o.floor = 0.1;
  check_gradient("softmax_xent mean", z.data(), n * k, d, mean_loss, o);
}

// ---- Whole models ------------------------------------------------------------------------------

struct ModelCheck {
  std::unique_ptr<Model> m;
  Tensor x;
  std::vector<int32_t> labels;
  int64_t n;

  ModelCheck(const std::string& name, int64_t batch, uint64_t seed)
      : m(make_model(name)), n(batch) {
    m->init_parameters("kaiming", seed);
    std::mt19937_64 g(seed);
    x = random_tensor({n, 28, 28, 1}, g, 0.f, 1.f);
    for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(g() % 10));
  }
  double loss() {
    const Tensor& z = m->forward(x, Mode::kTrain);
    return cpu::softmax_xent(z.data(), labels.data(), n, 10, 1.f, nullptr, nullptr) / n;
  }
  // Forward + backward of the mean cross-entropy; grads overwritten (or added to).
  void backward(BackwardCtx& ctx) {
    const Tensor& z = m->forward(x, Mode::kTrain);
    Tensor dz(z.shape());
    cpu::softmax_xent(z.data(), labels.data(), n, 10, 1.f / static_cast<float>(n), dz.data(),
                      nullptr);
    m->backward(dz, ctx);
  }
};

int64_t argmax_abs(const std::vector<float>& v) {
  int64_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (std::fabs(v[i]) > std::fabs(v[static_cast<size_t>(best)])) best = static_cast<int64_t>(i);
  return best;
}

TEST(GradCheck, LeNetModel) {
  ModelCheck mc("lenet", 3, 130);
  ParamStore& st = mc.m->store();
  std::fill(st.grads(), st.grads() + st.num_params(), 5.f);  // backward overwrites
  BackwardCtx ctx;
  mc.backward(ctx);
  int tensors = 0;
  for (Param& p : st.entries()) {
    std::vector<float> gp(p.grad.data(), p.grad.data() + p.numel());
    // Perturbing a conv1 weight moves ~40k ReLU inputs, so some always cross 0 and each crossing
    // bends the loss a little: a small step, coordinates whose one-sided slopes disagree skipped,
    // and 2% of the tensor's largest sampled gradient as tolerance (float rounding of the loss
    // bounds the step from below; over 60 seeds the worst error was 1.1%). The tensor's largest
    // gradient is always among those checked.
    CheckOpts o;
    o.count = 30;
    o.kinks = true;
    o.eps = 5e-4;
    o.max_skip = 0.5;
    o.floor = 1e-3;
    o.rtol = 2e-2;
    o.rel_floor = 1.0;
    o.l2 = 5e-2;
    o.seed = 131 + static_cast<uint64_t>(tensors);
    o.must = {argmax_abs(gp)};
    check_gradient(
        "lenet " + p.name, p.value.data(), p.numel(), gp, [&] { return mc.loss(); }, o);
    ++tensors;
  }
  EXPECT_EQ(tensors, 8);
}

TEST(GradCheck, ResNet18ModelFewCoordinates) {
  ModelCheck mc("resnet18", 2, 140);
  BackwardCtx ctx;
  mc.backward(ctx);
  // Tolerances relative to the largest sampled gradient of each tensor. Perturbing an early weight
  // moves ~10^6 ReLU inputs through train-mode BN, and the ones within ~1e-6 of their kink bend the
  // loss by a step-independent amount: measured over 20 seeds, conv1.weight's finite differences
  // are off by up to 2.5-4% (the same at steps 5e-4..2e-3), downsample's by 1.5%, the rest far
  // less. Wiring errors (sign, factor 2, a missing branch) are off by 50% and more.
  const std::pair<const char*, double> checks[] = {{"conv1.weight", 8e-2},
                                                   {"layer2.0.downsample.weight", 4e-2},
                                                   {"layer4.1.bn2.weight", 2e-2},
                                                   {"fc.weight", 2e-3}};
  for (const auto& [name, rtol] : checks) {
    Param* p = mc.m->store().find(name);
    ASSERT_NE(p, nullptr) << name;
    std::vector<float> gp(p->grad.data(), p->grad.data() + p->numel());
    CheckOpts o;
    o.count = 4;
    o.eps = 1e-3;
    o.rtol = rtol;
    o.floor = 1e-4;
    o.rel_floor = 1.0;
    o.l2 = 2 * rtol;
    o.seed = 141;
    o.must = {argmax_abs(gp)};
    check_gradient(
        std::string("resnet18 ") + name, p->value.data(), p->numel(), gp, [&] { return mc.loss(); },
        o);
  }
}

// ---- Gradient-ready announcements
// -----------------------------------------------------------------

void check_announcements(const std::string& name, int expect_count) {
  SCOPED_TRACE(name);
  ModelCheck mc(name, 2, 150);
  ParamStore& st = mc.m->store();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::vector<float>> snap;  // the gradients of each range when it was announced
  BackwardCtx ctx;
  ctx.on_ready = [&](int64_t b, int64_t e) {
    ranges.emplace_back(b, e);
    snap.emplace_back(st.grads() + b, st.grads() + e);
  };
  mc.backward(ctx);
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(static_cast<int>(ranges.size()), expect_count);
  EXPECT_EQ(ranges.front().first, 0);
  int64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_LT(ranges[i].first, ranges[i].second) << i;
    if (i > 0) {
      EXPECT_EQ(ranges[i].first, ranges[i - 1].second) << "gap or overlap at " << i;
    }
    covered += ranges[i].second - ranges[i].first;
    // Announced gradients are final: nothing later in backward changes them.
    for (int64_t j = ranges[i].first; j < ranges[i].second; ++j)
      ASSERT_EQ(st.grads()[j], snap[i][static_cast<size_t>(j - ranges[i].first)]) << "range " << i;
  }
  EXPECT_EQ(ranges.back().second, st.num_params());
  EXPECT_EQ(covered, st.num_params());
}

TEST(BackwardCtx, AnnouncementsCoverLeNetInOrder) { check_announcements("lenet", 4); }

// conv1, bn1, 8 blocks x (2 convs + 2 BNs), 3 downsample convs, fc.
TEST(BackwardCtx, AnnouncementsCoverResNet18InOrder) {
  check_announcements("resnet18", 2 + 32 + 3 + 1);
}

// torchvision's layout: conv1, bn1, per BasicBlock 2 convs + 2 BNs (ResNet-18: 8 blocks), per
// Bottleneck 3 + 3 (ResNet-50: 16), each downsample a conv and a BN (3 in ResNet-18, 4 in
// ResNet-50, whose first block widens 64 to 256), fc.
TEST(BackwardCtx, AnnouncementsCoverTorchvisionResNetsInOrder) {
  check_announcements("resnet18-tv", 2 + 8 * 4 + 3 * 2 + 1);
  check_announcements("resnet50", 2 + 16 * 6 + 4 * 2 + 1);
}

// ---- Gradient accumulation
// --------------------------------------------------------------------------

void check_accumulate(const std::string& what, std::unique_ptr<Layer> layer, const Shape& in,
                      uint64_t seed) {
  SCOPED_TRACE(what);
  LayerCheck c(std::move(layer), in, 3, seed, what);
  ParamStore& st = c.store;
  const int64_t np = st.num_params();
  ASSERT_GT(np, 0);
  c.layer->forward(c.x, c.y, Mode::kTrain);
  std::fill(st.grads(), st.grads() + np, 9.f);  // a non-accumulating backward overwrites
  BackwardCtx ctx;
  Tensor dx1, dx2;
  c.layer->backward(c.x, c.y, c.r, &dx1, ctx);
  const std::vector<float> g1(st.grads(), st.grads() + np);
  ctx.accumulate = true;
  c.layer->backward(c.x, c.y, c.r, &dx2, ctx);
  double gmax = 0;
  for (int64_t i = 0; i < np; ++i) gmax = std::max(gmax, std::fabs(static_cast<double>(g1[i])));
  ASSERT_GT(gmax, 0.0);
  for (int64_t i = 0; i < np; ++i)
    ASSERT_NEAR(st.grads()[i], 2.0 * g1[static_cast<size_t>(i)],
                1e-6 * std::max(1.0, std::fabs(2.0 * g1[i])))
        << i;
  for (int64_t i = 0; i < dx1.numel(); ++i) ASSERT_EQ(dx1.data()[i], dx2.data()[i]) << "dx " << i;

  // A different upstream gradient accumulates to the sum of the two.
  Tensor r2(c.r.shape());
  for (int64_t i = 0; i < r2.numel(); ++i) r2.data()[i] = -0.5f * c.r.data()[i] + 0.25f;
  ctx.accumulate = false;
  c.layer->backward(c.x, c.y, r2, nullptr, ctx);
  const std::vector<float> g2(st.grads(), st.grads() + np);
  c.layer->backward(c.x, c.y, c.r, nullptr, ctx);
  ctx.accumulate = true;
  c.layer->backward(c.x, c.y, r2, nullptr, ctx);
  for (int64_t i = 0; i < np; ++i) {
    const double e = static_cast<double>(g1[i]) + g2[i];
    ASSERT_NEAR(st.grads()[i], e, 1e-5 * std::max(1.0, std::fabs(e))) << i;
  }
}

TEST(Accumulate, ConvLinearBatchNorm) {
  check_accumulate("conv", make_conv2d(4, 3, 2, 1), {7, 6, 3}, 160);
  check_accumulate("conv1x1", make_conv2d(5, 1, 1, 0), {4, 4, 6}, 161);
  check_accumulate("convnobias", make_conv2d(3, 3, 1, 0, false), {5, 5, 2}, 162);
  check_accumulate("convwinograd", make_conv2d(16, 3, 1, 1), {5, 5, 16}, 166);
  check_accumulate("fc", make_linear(6), {11}, 163);
  check_accumulate("fcnobias", make_linear(4, false), {7}, 164);
  check_accumulate("bn", make_batchnorm2d(), {3, 3, 4}, 165);
}

TEST(Accumulate, LeNetModel) {
  ModelCheck mc("lenet", 2, 170);
  ParamStore& st = mc.m->store();
  BackwardCtx ctx;
  mc.backward(ctx);
  const std::vector<float> g1(st.grads(), st.grads() + st.num_params());
  ctx.accumulate = true;
  mc.backward(ctx);
  for (int64_t i = 0; i < st.num_params(); ++i)
    ASSERT_NEAR(st.grads()[i], 2.0 * g1[static_cast<size_t>(i)],
                1e-6 * std::max(1e-3, std::fabs(2.0 * g1[static_cast<size_t>(i)])))
        << i;
}

// oneDNN 2.6's jit_1x1:avx2 backward-weights for a 1x1 stride-2 convolution with fewer than 8 input
// channels on an even-sized input writes past the end of a heap block (valgrind: "Invalid write of
// size 8 ... 0 bytes after a block of size 396 alloc'd" in dnnl_primitive_create's allocation);
// the process then dies in free(). Reproduces with the plain oneDNN API, so it is a oneDNN bug that
// src/cpu/conv.cc would have to route around (e.g. skip jit_1x1 implementations via next_impl()).
// Enable once it does; run under valgrind to see the corruption even when it does not crash.
TEST(GradCheck, Conv2d1x1Stride2FewInputChannels) {
  LayerCheck c(make_conv2d(4, 1, 2, 0), {6, 6, 3}, 2, 118, "conv");
  c.run("conv 1x1 s2 cin3", {});
}

}  // namespace
}  // namespace dpt
