// The layers of include/dpt/nn.h on the CPU backend. Each public forward/backward checks the
// shapes it is handed, then calls src/cpu; each leaf backward ends by announcing its gradients.
#include <cmath>
#include <vector>

#include "cpu/conv.h"
#include "cpu/ops.h"
#include "dpt/error.h"
#include "dpt/nn.h"
#include "dpt/trace.h"

namespace dpt {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  if (name.empty()) return prefix;
  return prefix + "." + name;
}

// Checks x is {N, per_sample...} for the shape the layer was built with.
void check_input(const char* layer, const Tensor& x, const Shape& per_sample) {
  bool ok = x.rank() == static_cast<int>(per_sample.size()) + 1 && x.dim(0) > 0;
  for (size_t i = 0; ok && i < per_sample.size(); ++i) ok = x.shape()[i + 1] == per_sample[i];
  DPT_CHECK(ok, layer << ": input " << shape_str(x.shape()) << " does not match built shape [N, "
                      << shape_str(per_sample) << "]");
}

Tensor* prepare_dx(Tensor* dx, const Tensor& x) {
  if (dx) dx->resize(x.shape());
  return dx;
}

class Conv2d : public Layer {
 public:
  Conv2d(int64_t out, int64_t k, int64_t s, int64_t p, bool bias)
      : out_(out), k_(k), s_(s), p_(p), bias_(bias) {}
  std::string kind() const override { return "Conv2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 3, "Conv2d needs an {H, W, C} input, got " << shape_str(in));
    in_ = in;
    geom_ = cpu::ConvGeom{0, in[0], in[1], in[2], out_, k_, s_, p_};
    DPT_CHECK(geom_.oh() > 0 && geom_.ow() > 0, "Conv2d output would be empty for " << shape_str(in));
    w_ = store.add_param(join(prefix, "weight"), {out_, in[2], k_, k_}, Init::kWeight,
                         in[2] * k_ * k_, out_ * k_ * k_);
    if (bias_) b_ = store.add_param(join(prefix, "bias"), {out_}, Init::kBias, in[2] * k_ * k_, 0);
    return {geom_.oh(), geom_.ow(), out_};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input("Conv2d", x, in_);
    geom_.n = x.dim(0);
    y.resize({geom_.n, geom_.oh(), geom_.ow(), out_});
    prims_.forward(geom_, x.data(), w_->value.data(), b_ ? b_->value.data() : nullptr, y.data());
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    check_input("Conv2d", x, in_);
    geom_.n = x.dim(0);
    prims_.backward(geom_, x.data(), w_->value.data(), dy.data(),
                    prepare_dx(dx, x) ? dx->data() : nullptr, w_->grad.data(),
                    b_ ? b_->grad.data() : nullptr, ctx.accumulate);
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.out = {geom_.oh(), geom_.ow(), out_};
    s.kernel = k_, s.stride = s_, s.pad = p_;
    s.params = b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_};
    return s;
  }

 private:
  int64_t out_, k_, s_, p_;
  bool bias_;
  Shape in_;
  cpu::ConvGeom geom_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  cpu::ConvPrimitives prims_;
};

class BatchNorm2d : public Layer {
 public:
  BatchNorm2d(double momentum, double eps) : momentum_(momentum), eps_(eps) {}
  std::string kind() const override { return "BatchNorm2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 3, "BatchNorm2d needs an {H, W, C} input, got " << shape_str(in));
    in_ = in;
    const int64_t c = in[2];
    gamma_ = store.add_param(join(prefix, "weight"), {c}, Init::kOnes, 0, 0);
    beta_ = store.add_param(join(prefix, "bias"), {c}, Init::kZeros, 0, 0);
    running_mean_ = store.add_buffer(join(prefix, "running_mean"), {c}, Init::kZeros);
    running_var_ = store.add_buffer(join(prefix, "running_var"), {c}, Init::kOnes);
    num_batches_ = store.add_buffer(join(prefix, "num_batches_tracked"), {}, Init::kZeros, true);
    mean_.resize(static_cast<size_t>(c));
    invstd_.resize(static_cast<size_t>(c));
    return in;
  }
  void forward(const Tensor& x, Tensor& y, Mode mode) override {
    check_input("BatchNorm2d", x, in_);
    const int64_t c = in_[2], m = x.numel() / c;
    y.resize(x.shape());
    train_mode_ = mode == Mode::kTrain;
    if (mode == Mode::kTrain) {
      // [sum(c), sumsq(c), rows]: one buffer so synchronised BN needs one all-reduce.
      std::vector<double> stats(static_cast<size_t>(2 * c + 1));
      cpu::bn_sums(x.data(), m, c, stats.data(), stats.data() + c);
      stats[2 * c] = static_cast<double>(m);
      if (sync_) sync_(stats.data(), 2 * c + 1);
      const double count = stats[2 * c];
      count_ = count;
      float* rm = running_mean_->value.data();
      float* rv = running_var_->value.data();
      for (int64_t ch = 0; ch < c; ++ch) {
        const double mean = stats[ch] / count;
        const double var = std::max(0.0, stats[c + ch] / count - mean * mean);
        mean_[ch] = static_cast<float>(mean);
        invstd_[ch] = static_cast<float>(1.0 / std::sqrt(var + eps_));
        const double unbiased = count > 1 ? var * count / (count - 1) : var;
        rm[ch] = static_cast<float>((1 - momentum_) * rm[ch] + momentum_ * mean);
        rv[ch] = static_cast<float>((1 - momentum_) * rv[ch] + momentum_ * unbiased);
      }
      num_batches_->value.data()[0] += 1.f;
    } else {
      const float* rm = running_mean_->value.data();
      const float* rv = running_var_->value.data();
      for (int64_t ch = 0; ch < c; ++ch) {
        mean_[ch] = rm[ch];
        invstd_[ch] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rv[ch]) + eps_));
      }
    }
    cpu::bn_apply(x.data(), y.data(), mean_.data(), invstd_.data(), gamma_->value.data(),
                  beta_->value.data(), m, c);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    check_input("BatchNorm2d", x, in_);
    const int64_t c = in_[2], m = x.numel() / c;
    std::vector<double> sums(static_cast<size_t>(2 * c));
    cpu::bn_backward_sums(x.data(), dy.data(), mean_.data(), invstd_.data(), m, c, sums.data(),
                          sums.data() + c);
    // Parameter gradients are this replica's own sums (the reducer adds the replicas up).
    float* dg = gamma_->grad.data();
    float* db = beta_->grad.data();
    for (int64_t ch = 0; ch < c; ++ch) {
      dg[ch] = static_cast<float>((ctx.accumulate ? dg[ch] : 0.0) + sums[c + ch]);
      db[ch] = static_cast<float>((ctx.accumulate ? db[ch] : 0.0) + sums[ch]);
    }
    if (prepare_dx(dx, x) && !train_mode_) {
      // Eval mode: the statistics are constants, so dx = dy * gamma * invstd.
      std::vector<float> zero(static_cast<size_t>(c), 0.f);
      cpu::bn_apply(dy.data(), dx->data(), zero.data(), invstd_.data(), gamma_->value.data(),
                    zero.data(), m, c);
    } else if (dx) {
      // The input gradient needs the sums over every row the statistics were taken over.
      if (sync_) sync_(sums.data(), 2 * c);
      cpu::bn_backward_apply(x.data(), dy.data(), mean_.data(), invstd_.data(),
                             gamma_->value.data(), sums.data(), sums.data() + c, count_, m, c,
                             dx->data());
    }
    ctx.ready({gamma_, beta_});
  }
  void set_sync(const ChannelSumFn& fn) { sync_ = fn; }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = s.out = in_;
    s.momentum = momentum_, s.eps = eps_;
    s.params = {gamma_, beta_, running_mean_, running_var_, num_batches_};
    return s;
  }

 private:
  double momentum_, eps_;
  Shape in_;
  Param *gamma_ = nullptr, *beta_ = nullptr, *running_mean_ = nullptr, *running_var_ = nullptr,
        *num_batches_ = nullptr;
  std::vector<float> mean_, invstd_;
  double count_ = 0;
  bool train_mode_ = true;  // mode of the last forward: backward must match it
  ChannelSumFn sync_;
};

class ReLU : public Layer {
 public:
  std::string kind() const override { return "ReLU"; }
  Shape build(const Shape& in, ParamStore&, const std::string&) override { return in_ = in; }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input("ReLU", x, in_);
    y.resize(x.shape());
    cpu::relu_forward(x.data(), y.data(), x.numel());
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x)) cpu::relu_backward(y.data(), dy.data(), dx->data(), x.numel());
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = s.out = in_;
    return s;
  }

 private:
  Shape in_;
};

// AvgPool2d, optionally fused with the ReLU before it (relu = true): one pass each way, and the
// ReLU output is never stored (backward masks with the input instead). The fused form gives the
// same results as ReLU then AvgPool2d.
class AvgPool2d : public Layer {
 public:
  AvgPool2d(int k, int s, bool relu) : k_(k), s_(s), relu_(relu) {}
  std::string kind() const override { return relu_ ? "ReLU+AvgPool2d" : "AvgPool2d"; }
  Shape build(const Shape& in, ParamStore&, const std::string&) override {
    DPT_CHECK(in.size() == 3 && in[0] >= k_ && in[1] >= k_,
              kind() << "(" << k_ << ") needs an {H, W, C} input of at least that size, got "
                     << shape_str(in));
    in_ = in;
    return {(in[0] - k_) / s_ + 1, (in[1] - k_) / s_ + 1, in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(kind().c_str(), x, in_);
    y.resize({x.dim(0), (in_[0] - k_) / s_ + 1, (in_[1] - k_) / s_ + 1, in_[2]});
    (relu_ ? cpu::relu_avgpool_forward : cpu::avgpool_forward)(x.data(), y.data(), x.dim(0), in_[0],
                                                               in_[1], in_[2], k_, s_);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    if (!prepare_dx(dx, x)) return;
    if (relu_)
      cpu::relu_avgpool_backward(x.data(), dy.data(), dx->data(), x.dim(0), in_[0], in_[1], in_[2], k_, s_);
    else
      cpu::avgpool_backward(dy.data(), dx->data(), x.dim(0), in_[0], in_[1], in_[2], k_, s_);
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.out = {(in_[0] - k_) / s_ + 1, (in_[1] - k_) / s_ + 1, in_[2]};
    s.kernel = k_, s.stride = s_, s.relu = relu_;
    return s;
  }

 private:
  int k_, s_;
  bool relu_;
  Shape in_;
};

class GlobalAvgPool : public Layer {
 public:
  std::string kind() const override { return "GlobalAvgPool"; }
  Shape build(const Shape& in, ParamStore&, const std::string&) override {
    DPT_CHECK(in.size() == 3, "GlobalAvgPool needs an {H, W, C} input, got " << shape_str(in));
    in_ = in;
    return {in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input("GlobalAvgPool", x, in_);
    y.resize({x.dim(0), in_[2]});
    cpu::global_avgpool_forward(x.data(), y.data(), x.dim(0), in_[0] * in_[1], in_[2]);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x))
      cpu::global_avgpool_backward(dy.data(), dx->data(), x.dim(0), in_[0] * in_[1], in_[2]);
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.out = {in_[2]};
    return s;
  }

 private:
  Shape in_;
};

// NHWC {H, W, C} -> {C*H*W} in PyTorch's (c, h, w) order, so fc1.weight keeps PyTorch's layout.
class Flatten : public Layer {
 public:
  std::string kind() const override { return "Flatten"; }
  Shape build(const Shape& in, ParamStore&, const std::string&) override {
    DPT_CHECK(in.size() == 3, "Flatten needs an {H, W, C} input, got " << shape_str(in));
    in_ = in;
    return {in[0] * in[1] * in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input("Flatten", x, in_);
    y.resize({x.dim(0), in_[0] * in_[1] * in_[2]});
    cpu::nhwc_to_chw(x.data(), y.data(), x.dim(0), in_[0], in_[1], in_[2]);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x)) cpu::chw_to_nhwc(dy.data(), dx->data(), x.dim(0), in_[0], in_[1], in_[2]);
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.out = {in_[0] * in_[1] * in_[2]};
    return s;
  }

 private:
  Shape in_;
};

class Linear : public Layer {
 public:
  Linear(int64_t out, bool bias) : out_(out), bias_(bias) {}
  std::string kind() const override { return "Linear"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 1, "Linear needs a flat {F} input, got " << shape_str(in));
    in_ = in;
    w_ = store.add_param(join(prefix, "weight"), {out_, in[0]}, Init::kWeight, in[0], out_);
    if (bias_) b_ = store.add_param(join(prefix, "bias"), {out_}, Init::kBias, in[0], 0);
    return {out_};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input("Linear", x, in_);
    y.resize({x.dim(0), out_});
    cpu::linear_forward(x.data(), w_->value.data(), b_ ? b_->value.data() : nullptr, y.data(),
                        x.dim(0), in_[0], out_);
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    check_input("Linear", x, in_);
    cpu::linear_backward(x.data(), w_->value.data(), dy.data(),
                         prepare_dx(dx, x) ? dx->data() : nullptr, w_->grad.data(),
                         b_ ? b_->grad.data() : nullptr, x.dim(0), in_[0], out_, ctx.accumulate);
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.out = {out_};
    s.params = b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_};
    return s;
  }

 private:
  int64_t out_;
  bool bias_;
  Shape in_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
};

class Residual : public Layer {
 public:
  Residual(int64_t channels, bool use_1x1conv, int64_t stride) {
    main_.add("conv1", make_conv2d(channels, 3, stride, 1))
        .add("bn1", make_batchnorm2d())
        .add("", make_relu())
        .add("conv2", make_conv2d(channels, 3, 1, 1))
        .add("bn2", make_batchnorm2d());
    if (use_1x1conv) shortcut_ = make_conv2d(channels, 1, stride, 0);
  }
  std::string kind() const override { return "Residual"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    in_ = in;
    // Registration order main-then-shortcut puts the shortcut's gradients first in the flat
    // buffer, matching backward, which does the shortcut first.
    Shape out = main_.build(in, store, prefix);
    if (shortcut_) {
      Shape s = shortcut_->build(in, store, join(prefix, "downsample"));
      DPT_CHECK(s == out, "Residual shortcut shape " << shape_str(s) << " != " << shape_str(out));
    } else {
      DPT_CHECK(in == out, "Residual without 1x1 conv needs equal shapes, got "
                               << shape_str(in) << " -> " << shape_str(out));
    }
    return out;
  }
  void forward(const Tensor& x, Tensor& y, Mode mode) override {
    check_input("Residual", x, in_);
    main_.forward(x, main_out_, mode);
    const Tensor* skip = &x;
    if (shortcut_) {
      shortcut_->forward(x, short_out_, mode);
      skip = &short_out_;
    }
    y.resize(main_out_.shape());
    cpu::add(main_out_.data(), skip->data(), y.data(), y.numel());
    cpu::relu_forward(y.data(), y.data(), y.numel());
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    dz_.resize(y.shape());
    cpu::relu_backward(y.data(), dy.data(), dz_.data(), y.numel());
    if (shortcut_) shortcut_->backward(x, short_out_, dz_, dx ? &dskip_ : nullptr, ctx);
    main_.backward(x, main_out_, dz_, prepare_dx(dx, x), ctx);
    if (dx) cpu::add_inplace(dx->data(), shortcut_ ? dskip_.data() : dz_.data(), dx->numel());
  }
  void visit(const std::function<void(Layer&)>& fn) override {
    fn(*this);
    main_.visit(fn);
    if (shortcut_) shortcut_->visit(fn);
  }
  LayerSpec spec() override {
    LayerSpec s;
    s.in = in_;
    s.children.emplace_back("", &main_);
    if (shortcut_) s.children.emplace_back("downsample", shortcut_.get());
    return s;
  }

 private:
  Sequential main_;
  std::unique_ptr<Layer> shortcut_;
  Shape in_;
  Tensor main_out_, short_out_, dz_, dskip_;
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(int64_t out, int64_t k, int64_t s, int64_t p, bool bias) {
  return std::make_unique<Conv2d>(out, k, s, p, bias);
}
std::unique_ptr<Layer> make_batchnorm2d(double momentum, double eps) {
  return std::make_unique<BatchNorm2d>(momentum, eps);
}
std::unique_ptr<Layer> make_relu() { return std::make_unique<ReLU>(); }
std::unique_ptr<Layer> make_avgpool2d(int k, int s) { return std::make_unique<AvgPool2d>(k, s, false); }
std::unique_ptr<Layer> make_relu_avgpool2d(int k, int s) {
  return std::make_unique<AvgPool2d>(k, s, true);
}
std::unique_ptr<Layer> make_global_avgpool() { return std::make_unique<GlobalAvgPool>(); }
std::unique_ptr<Layer> make_flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> make_linear(int64_t out, bool bias) {
  return std::make_unique<Linear>(out, bias);
}
std::unique_ptr<Layer> make_residual(int64_t channels, bool use_1x1conv, int64_t stride) {
  return std::make_unique<Residual>(channels, use_1x1conv, stride);
}
void set_batchnorm_sync(Layer& layer, const ChannelSumFn& fn) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&layer)) bn->set_sync(fn);
}

// ---- Sequential ----------------------------------------------------------------------------

Sequential& Sequential::add(const std::string& name, std::unique_ptr<Layer> layer) {
  children_.emplace_back(name, std::move(layer));
  return *this;
}

Shape Sequential::build(const Shape& in, ParamStore& store, const std::string& prefix) {
  DPT_CHECK(!children_.empty(), "empty Sequential " << prefix);
  Shape s = in;
  span_names_.clear();
  for (auto& [name, layer] : children_) {
    s = layer->build(s, store, join(prefix, name));
    span_names_.push_back("backward " + (name.empty() ? join(prefix, layer->kind()) : join(prefix, name)));
  }
  acts_.resize(children_.size() - 1);
  grads_.resize(children_.size() - 1);
  return s;
}

void Sequential::forward(const Tensor& x, Tensor& y, Mode mode) {
  const size_t n = children_.size();
  for (size_t i = 0; i < n; ++i) {
    const Tensor& in = i == 0 ? x : acts_[i - 1];
    Tensor& out = i + 1 == n ? y : acts_[i];
    children_[i].second->forward(in, out, mode);
  }
}

void Sequential::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                          BackwardCtx& ctx) {
  const size_t n = children_.size();
  for (size_t i = n; i-- > 0;) {
    const Tensor& in = i == 0 ? x : acts_[i - 1];
    const Tensor& out = i + 1 == n ? y : acts_[i];
    const Tensor& g = i + 1 == n ? dy : grads_[i];
    Tensor* gin = i == 0 ? dx : &grads_[i - 1];
    TraceScope span(ctx.tracer, span_names_[i].c_str(), "backward");
    children_[i].second->backward(in, out, g, gin, ctx);
  }
}

void Sequential::visit(const std::function<void(Layer&)>& fn) {
  fn(*this);
  for (auto& c : children_) c.second->visit(fn);
}

LayerSpec Sequential::spec() {
  LayerSpec s;
  for (auto& [name, layer] : children_) s.children.emplace_back(name, layer.get());
  return s;
}

}  // namespace dpt
