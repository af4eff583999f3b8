// The layers of include/dpt/nn.h, once for every backend: each public forward/backward checks the
// shapes it is handed, then calls the backend's operations (backend.h) on the backend memory of its
// tensors and parameters; each leaf backward ends by announcing its gradients. The backend is the
// ParamStore's, taken at build(). Activations are float or bfloat16 (Model's activation type): a
// layer's output, and every gradient it makes, takes its input's element type, and each operation
// is written once over that type T (on_type).
#include <utility>
#include <vector>

#include "dpt/backend.h"
#include "dpt/error.h"
#include "dpt/nn.h"
#include "dpt/trace.h"

namespace dpt {

namespace {

// Calls f with a null T* for the element type `dt` holds (float or BFloat16), so that a layer's
// calls are written once, as a lambda templated on T, and the backend's overload is chosen by type.
template <typename F>
void on_type(DType dt, F&& f) {
  if (dt == DType::kBF16)
    f(static_cast<BFloat16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

std::string join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  if (name.empty()) return prefix;
  return prefix + "." + name;
}

// What every non-composite layer shares: its backend and per-sample input shape from build(), the
// input check and the allocation of outputs in the backend's memory.
class Leaf : public Layer {
 protected:
  void bind(const Shape& in, ParamStore& store) {
    in_ = in;
    be_ = &store.backend();
  }
  // x must be {N, in...} for the shape the layer was built with.
  void check_input(const Tensor& x) const {
    bool ok = x.rank() == static_cast<int>(in_.size()) + 1 && x.dim(0) > 0;
    for (size_t i = 0; ok && i < in_.size(); ++i) ok = x.shape()[i + 1] == in_[i];
    DPT_CHECK(ok, kind() << ": input " << shape_str(x.shape()) << " does not match built shape [N, "
                         << shape_str(in_) << "]");
  }
  // y: `shape`, in the backend's memory, of x's element type.
  void output(Tensor& y, const Shape& shape, const Tensor& x) const {
    y.resize(shape, be_, x.dtype());
  }
  template <typename T>
  T* prepare_dx(Tensor* dx, const Tensor& x) const {
    if (!dx) return nullptr;
    dx->resize(x.shape(), be_, x.dtype());
    return dx->ptr<T>();
  }
  static float* value(Param* p) { return p ? p->device_value : nullptr; }
  static float* grad(Param* p) { return p ? p->device_grad : nullptr; }

  Backend* be_ = nullptr;
  Shape in_;
};

class Conv2d : public Leaf {
 public:
  Conv2d(int64_t out, int64_t k, int64_t s, int64_t p, bool bias)
      : out_(out), k_(k), s_(s), p_(p), bias_(bias) {}
  std::string kind() const override { return "Conv2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 3, "Conv2d needs an {H, W, C} input, got " << shape_str(in));
    bind(in, store);
    geom_ = ConvGeom{0, in[0], in[1], in[2], out_, k_, s_, p_};
    DPT_CHECK(geom_.oh() > 0 && geom_.ow() > 0,
              "Conv2d output would be empty for " << shape_str(in));
    w_ = store.add_param(join(prefix, "weight"), {out_, in[2], k_, k_}, Init::kWeight,
                         in[2] * k_ * k_, out_ * k_ * k_);
    if (bias_) b_ = store.add_param(join(prefix, "bias"), {out_}, Init::kBias, in[2] * k_ * k_, 0);
    op_ = be_->make_conv();
    return {geom_.oh(), geom_.ow(), out_};
  }
  int64_t flops() const override {
    return 2 * geom_.oh() * geom_.ow() * out_ * geom_.c_in * k_ * k_;
  }
  void forward(const Tensor& x, Tensor& y, Mode mode) override {
    check_input(x);
    geom_.n = x.dim(0);
    output(y, {geom_.n, geom_.oh(), geom_.ow(), out_}, x);
    // A folded bias is left out in training: the BatchNorm after this convolution ignores it.
    const float* b = folded_ && mode == Mode::kTrain ? nullptr : value(b_);
    trained_ = mode == Mode::kTrain;
    on_type(x.dtype(),
            [&]<typename T>(T*) { op_->forward(geom_, x.ptr<T>(), value(w_), b, y.ptr<T>()); });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    check_input(x);
    geom_.n = x.dim(0);
    // After a training forward, a folded bias's gradient is 0: it is the sum over the rows of dy,
    // the gradient that training-mode BatchNorm gives its input, whose sum over each channel is 0
    // (over all replicas' rows under synchronised BatchNorm, so the all-reduced gradient is 0
    // there too). Summing dy would only add up rounding noise (0.27 of 5.9 ms of ResNet-18's bf16
    // step on an H100). After an evaluation forward it is the sum, as without the fold.
    const bool zero_db = folded_ && trained_;
    on_type(x.dtype(), [&]<typename T>(T*) {
      op_->backward(geom_, x.ptr<T>(), value(w_), dy.ptr<T>(), prepare_dx<T>(dx, x), grad(w_),
                    zero_db ? nullptr : grad(b_), ctx.accumulate);
    });
    if (zero_db && !ctx.accumulate) be_->zero(grad(b_), static_cast<size_t>(out_) * sizeof(float));
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }
  // From now on training forwards leave the bias out, and backwards after them give it a zero
  // gradient (fold_conv_biases); returns it (null without one).
  Param* fold_bias() {
    folded_ = b_ != nullptr;
    return b_;
  }

 private:
  int64_t out_, k_, s_, p_;
  bool bias_;
  bool folded_ = false;
  bool trained_ = false;  // the last forward was a training one
  ConvGeom geom_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  std::unique_ptr<ConvOp> op_;
};

// BatchNorm2d, optionally fused with the ReLU after it (relu = true): the ReLU runs inside
// BatchNorm's own passes (BatchNormOp's epilogue forward, its masked gradient backward), and the
// BatchNorm output is never stored (backward masks with the layer's output instead). Residual
// also joins its skip path in (forward_join, backward_join). The fused form gives the same
// results as BatchNorm2d then (add then) ReLU.
class BatchNorm2d : public Leaf {
 public:
  // gamma_init: the weight's initial value, kOnes (PyTorch's) or kZeros (a residual block's last
  // BatchNorm under --zero-init-residual).
  BatchNorm2d(double momentum, double eps, bool relu, Init gamma_init = Init::kOnes)
      : momentum_(momentum), eps_(eps), relu_(relu), gamma_init_(gamma_init) {}
  std::string kind() const override { return relu_ ? "BatchNorm2d+ReLU" : "BatchNorm2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 3, kind() << " needs an {H, W, C} input, got " << shape_str(in));
    bind(in, store);
    const int64_t c = in[2];
    gamma_ = store.add_param(join(prefix, "weight"), {c}, gamma_init_, 0, 0);
    beta_ = store.add_param(join(prefix, "bias"), {c}, Init::kZeros, 0, 0);
    running_mean_ = store.add_buffer(join(prefix, "running_mean"), {c}, Init::kZeros);
    running_var_ = store.add_buffer(join(prefix, "running_var"), {c}, Init::kOnes);
    num_batches_ = store.add_buffer(join(prefix, "num_batches_tracked"), {}, Init::kZeros, true);
    op_ = be_->make_batchnorm(c, momentum_, eps_);
    return in;
  }
  void forward(const Tensor& x, Tensor& y, Mode mode) override {
    forward_join(x, nullptr, y, mode);
  }
  // y = bn(x) + residual (nullable, shaped like x), then the ReLU when fused.
  void forward_join(const Tensor& x, const Tensor* residual, Tensor& y, Mode mode) {
    check_input(x);
    DPT_CHECK(!residual || residual->shape() == x.shape(),
              kind() << ": residual " << shape_str(residual->shape()) << " != input "
                     << shape_str(x.shape()));
    const int64_t m = x.numel() / in_[2];
    // One value per channel has no batch statistics: the output would be beta whatever the input,
    // with no gradient through the normalisation. torch's BatchNorm refuses it (a ValueError,
    // "Expected more than 1 value per channel when training"), and so does SyncBatchNorm at one
    // rank; with --sync-bn over ranks the statistics take every rank's rows.
    DPT_INPUT_CHECK(
        mode != Mode::kTrain || m > 1 || sync_,
        gamma_->name.substr(0, gamma_->name.size() - 7)
            << " (BatchNorm) sees one value per channel in training (" << x.dim(0) << " image at "
            << in_[0] << "x" << in_[1]
            << "): its batch statistics are undefined, as torch's BatchNorm refuses; use a larger "
               "--batch-size per rank, --sync-bn across ranks, or larger images");
    output(y, x.shape(), x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      const T* r = residual ? residual->ptr<T>() : nullptr;
      if (mode == Mode::kTrain)
        op_->forward_train(x.ptr<T>(), y.ptr<T>(), m, value(gamma_), value(beta_),
                           value(running_mean_), value(running_var_), value(num_batches_), sync_, r,
                           relu_);
      else
        op_->forward_eval(x.ptr<T>(), y.ptr<T>(), m, value(gamma_), value(beta_),
                          value(running_mean_), value(running_var_), r, relu_);
    });
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    backward_join(x, y, dy, dx, nullptr, ctx.accumulate);
    announce(ctx);
  }
  // backward without the announcement (a Residual makes it after its shortcut's, whose gradients
  // come first in the flat buffer); dz (nullable) receives the gradient through the ReLU, which
  // the join's skip path takes too.
  void backward_join(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx, Tensor* dz,
                     bool accumulate) {
    check_input(x);
    const int64_t m = x.numel() / in_[2];
    if (dz) output(*dz, y.shape(), x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      op_->backward(x.ptr<T>(), dy.ptr<T>(), prepare_dx<T>(dx, x), m, value(gamma_), grad(gamma_),
                    grad(beta_), accumulate, sync_, relu_ ? y.ptr<T>() : nullptr,
                    dz ? dz->ptr<T>() : nullptr);
    });
  }
  void announce(const BackwardCtx& ctx) const { ctx.ready({gamma_, beta_}); }
  void set_sync(const ChannelSumFn& fn) { sync_ = fn; }
  // The input lacks the per-channel `shift` (the folded bias of the convolution before): the
  // running mean moves by it too (BatchNormOp::set_mean_shift).
  void shift_running_mean(Param* shift) { op_->set_mean_shift(value(shift)); }

 private:
  double momentum_, eps_;
  bool relu_;
  Init gamma_init_;
  Param *gamma_ = nullptr, *beta_ = nullptr, *running_mean_ = nullptr, *running_var_ = nullptr,
        *num_batches_ = nullptr;
  std::unique_ptr<BatchNormOp> op_;
  ChannelSumFn sync_;
};

class ReLU : public Leaf {
 public:
  std::string kind() const override { return "ReLU"; }
  Shape build(const Shape& in, ParamStore& store, const std::string&) override {
    bind(in, store);
    return in;
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, x.shape(), x);
    on_type(x.dtype(),
            [&]<typename T>(T*) { be_->relu_forward(x.ptr<T>(), y.ptr<T>(), x.numel()); });
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x)) be_->relu_backward(y.ptr<T>(), dy.ptr<T>(), d, x.numel());
    });
  }
};

// AvgPool2d, optionally fused with the ReLU before it (relu = true): one pass each way, and the
// ReLU output is never stored (backward masks with the input instead). The fused form gives the
// same results as ReLU then AvgPool2d.
class AvgPool2d : public Leaf {
 public:
  AvgPool2d(int k, int s, bool relu) : k_(k), s_(s), relu_(relu) {}
  std::string kind() const override { return relu_ ? "ReLU+AvgPool2d" : "AvgPool2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string&) override {
    DPT_CHECK(in.size() == 3 && in[0] >= k_ && in[1] >= k_,
              kind() << "(" << k_ << ") needs an {H, W, C} input of at least that size, got "
                     << shape_str(in));
    bind(in, store);
    return {(in[0] - k_) / s_ + 1, (in[1] - k_) / s_ + 1, in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, {x.dim(0), (in_[0] - k_) / s_ + 1, (in_[1] - k_) / s_ + 1, in_[2]}, x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->avgpool_forward(x.ptr<T>(), y.ptr<T>(), x.dim(0), in_[0], in_[1], in_[2], k_, s_, relu_);
    });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x))
        be_->avgpool_backward(dy.ptr<T>(), relu_ ? x.ptr<T>() : nullptr, d, x.dim(0), in_[0],
                              in_[1], in_[2], k_, s_);
    });
  }

 private:
  int k_, s_;
  bool relu_;
};

class MaxPool2d : public Leaf {
 public:
  MaxPool2d(int k, int s, int pad) : k_(k), s_(s), pad_(pad) {}
  std::string kind() const override { return "MaxPool2d"; }
  Shape build(const Shape& in, ParamStore& store, const std::string&) override {
    DPT_CHECK(k_ >= 1 && s_ >= 1 && pad_ >= 0 && 2 * pad_ <= k_,
              "MaxPool2d(" << k_ << ", " << s_ << ", " << pad_
                           << ") needs kernel, stride >= 1 and 0 <= padding <= kernel/2");
    DPT_CHECK(in.size() == 3 && in[0] + 2 * pad_ >= k_ && in[1] + 2 * pad_ >= k_,
              kind() << "(" << k_ << ", pad " << pad_
                     << ") needs an {H, W, C} input of at least the window, got " << shape_str(in));
    bind(in, store);
    return {oh(), ow(), in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, {x.dim(0), oh(), ow(), in_[2]}, x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->maxpool_forward(x.ptr<T>(), y.ptr<T>(), x.dim(0), in_[0], in_[1], in_[2], k_, s_, pad_);
    });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x))
        be_->maxpool_backward(x.ptr<T>(), dy.ptr<T>(), d, x.dim(0), in_[0], in_[1], in_[2], k_, s_,
                              pad_);
    });
  }

 private:
  int64_t oh() const { return (in_[0] + 2 * pad_ - k_) / s_ + 1; }
  int64_t ow() const { return (in_[1] + 2 * pad_ - k_) / s_ + 1; }
  int k_, s_, pad_;
};

class GlobalAvgPool : public Leaf {
 public:
  std::string kind() const override { return "GlobalAvgPool"; }
  Shape build(const Shape& in, ParamStore& store, const std::string&) override {
    DPT_CHECK(in.size() == 3, "GlobalAvgPool needs an {H, W, C} input, got " << shape_str(in));
    bind(in, store);
    return {in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, {x.dim(0), in_[2]}, x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->global_avgpool_forward(x.ptr<T>(), y.ptr<T>(), x.dim(0), in_[0] * in_[1], in_[2]);
    });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x))
        be_->global_avgpool_backward(dy.ptr<T>(), d, x.dim(0), in_[0] * in_[1], in_[2]);
    });
  }
};

// NHWC {H, W, C} -> {C*H*W} in PyTorch's (c, h, w) order, so fc1.weight keeps PyTorch's layout.
class Flatten : public Leaf {
 public:
  std::string kind() const override { return "Flatten"; }
  Shape build(const Shape& in, ParamStore& store, const std::string&) override {
    DPT_CHECK(in.size() == 3, "Flatten needs an {H, W, C} input, got " << shape_str(in));
    bind(in, store);
    return {in[0] * in[1] * in[2]};
  }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, {x.dim(0), in_[0] * in_[1] * in_[2]}, x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->flatten(x.ptr<T>(), y.ptr<T>(), x.dim(0), in_[0], in_[1], in_[2], /*to_chw=*/true);
    });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx&) override {
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x))
        be_->flatten(dy.ptr<T>(), d, x.dim(0), in_[0], in_[1], in_[2], /*to_chw=*/false);
    });
  }
};

class Linear : public Leaf {
 public:
  Linear(int64_t out, bool bias) : out_(out), bias_(bias) {}
  std::string kind() const override { return "Linear"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    DPT_CHECK(in.size() == 1, "Linear needs a flat {F} input, got " << shape_str(in));
    bind(in, store);
    w_ = store.add_param(join(prefix, "weight"), {out_, in[0]}, Init::kWeight, in[0], out_);
    if (bias_) b_ = store.add_param(join(prefix, "bias"), {out_}, Init::kBias, in[0], 0);
    return {out_};
  }
  int64_t flops() const override { return 2 * in_[0] * out_; }
  void forward(const Tensor& x, Tensor& y, Mode) override {
    check_input(x);
    output(y, {x.dim(0), out_}, x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->linear_forward(x.ptr<T>(), value(w_), value(b_), y.ptr<T>(), x.dim(0), in_[0], out_);
    });
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    check_input(x);
    on_type(x.dtype(), [&]<typename T>(T*) {
      be_->linear_backward(x.ptr<T>(), value(w_), dy.ptr<T>(), prepare_dx<T>(dx, x), grad(w_),
                           grad(b_), x.dim(0), in_[0], out_, ctx.accumulate);
    });
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }

 private:
  int64_t out_;
  bool bias_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
};

// A convolution with a bias, then a BatchNorm (`a` then `b`): folds the bias into the BatchNorm's
// running mean (fold_conv_biases) and returns 1; else 0.
int fold_pair(Layer& a, Layer& b) {
  auto* conv = dynamic_cast<Conv2d*>(&a);
  auto* bn = dynamic_cast<BatchNorm2d*>(&b);
  if (!conv || !bn) return 0;
  Param* bias = conv->fold_bias();
  if (bias) bn->shift_running_mean(bias);
  return bias ? 1 : 0;
}

// A residual block: relu(join(main(x)) + (shortcut ? shortcut(x) : x)), where main ends with a
// convolution and `join` is the block's last BatchNorm (d2l's bn2; torchvision's bn2 or bn3).
// Every ReLU inside main is fused into the BatchNorm before it; `join` carries the join: its apply
// pass adds the skip and applies the final ReLU (where BatchNorm's apply, the add and the ReLU
// took a pass each), its backward's sums pass writes dz (dy through that ReLU), which the skip
// path takes too. d2l's Residual: main = conv1, bn1 + ReLU, conv2; shortcut a 1x1 convolution.
// torchvision's: no biases, and the shortcut a 1x1 convolution then BatchNorm.
class Residual : public Leaf, public Borrower {
 public:
  Residual(std::unique_ptr<Sequential> main, std::string join_name, Init join_gamma,
           std::unique_ptr<Layer> shortcut)
      : main_(std::move(main)),
        bn2_(std::make_unique<BatchNorm2d>(kBatchNormMomentum, kBatchNormEps, /*relu=*/true,
                                           join_gamma)),
        bn2_name_(std::move(join_name)),
        shortcut_(std::move(shortcut)) {}
  std::string kind() const override { return "Residual"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override {
    bind(in, store);
    // Registration order main (conv1, bn1, conv2, ...), the join's BatchNorm, then the shortcut
    // (PyTorch's state_dict order) puts the shortcut's gradients first in the flat buffer, so
    // backward announces them first.
    Shape out = out_ = bn2_->build(main_->build(in, store, prefix), store, join(prefix, bn2_name_));
    bn2_span_ = "backward " + join(prefix, bn2_name_);
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
    // The branch outputs (y's size each) are borrowed: kept for backward, which hands each back
    // once its last reader is done; under kInfer handed back at the end.
    const bool keep = begin_forward(mode);  // first: a bad input below leaves backward refused
    check_input(x);
    TensorPool& pool = this->pool();
    main_out_.give_back();  // kept by a forward that had no backward
    short_out_.give_back();
    const size_t out_bytes = static_cast<size_t>(x.dim(0) * shape_numel(out_)) * x.element_bytes();
    Loan main_out(pool, out_bytes);
    Loan short_out = shortcut_ ? Loan(pool, out_bytes) : Loan();
    main_->forward(x, *main_out, mode);
    const Tensor* skip = &x;
    if (shortcut_) {
      shortcut_->forward(x, *short_out, mode);
      skip = &*short_out;
    }
    bn2_->forward_join(*main_out, skip, y, mode);
    if (keep) {
      main_out_ = std::move(main_out);
      short_out_ = std::move(short_out);
    } else {
      main_out.give_back();
      short_out.give_back();
    }
    end_forward(keep);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override {
    begin_backward("Residual");
    TensorPool& pool = this->pool();
    // bn2 first, since it forms dz; its announcement waits for the shortcut's, so that the
    // announcements still grow a prefix of the flat gradient buffer (nn.h). Each gradient goes
    // back to the pool as soon as its last reader is done.
    Loan dmid(pool, main_out_->bytes()), dz(pool, y.bytes());
    {
      TraceScope span(ctx.tracer, bn2_span_.c_str(), "backward");
      bn2_->backward_join(*main_out_, y, dy, &*dmid, &*dz, ctx.accumulate);
    }
    Loan dskip;
    if (shortcut_) {
      if (dx) dskip = Loan(pool, x.bytes());
      shortcut_->backward(x, *short_out_, *dz, dx ? &*dskip : nullptr, ctx);
      dz.give_back();
      short_out_.give_back();
    }
    bn2_->announce(ctx);
    // The main branch's input gradient goes to its own buffer and the sum into dx: add() never
    // runs in place (the GPU kernel's operands are restrict-qualified).
    Loan dmain;
    if (dx) dmain = Loan(pool, x.bytes());
    main_->backward(x, *main_out_, *dmid, dx ? &*dmain : nullptr, ctx);
    dmid.give_back();
    main_out_.give_back();
    on_type(x.dtype(), [&]<typename T>(T*) {
      if (T* d = prepare_dx<T>(dx, x))
        be_->add(dmain->ptr<T>(), shortcut_ ? dskip->ptr<T>() : dz->ptr<T>(), d, dx->numel(),
                 /*relu=*/false);
    });
    dmain.give_back();
    dskip.give_back();
    dz.give_back();
  }
  void visit(const std::function<void(Layer&)>& fn) override {
    fn(*this);
    main_->visit(fn);
    bn2_->visit(fn);
    if (shortcut_) shortcut_->visit(fn);
  }
  // The main branch's last convolution feeds the join's BatchNorm (outside main_).
  int fold_conv_bias() { return fold_pair(main_->child(main_->size() - 1), *bn2_); }

 private:
  std::unique_ptr<Sequential> main_;  // d2l's: conv1, bn1 + ReLU, conv2
  std::unique_ptr<BatchNorm2d> bn2_;  // the join (named bn2_name_)
  std::string bn2_name_;
  std::unique_ptr<Layer> shortcut_;
  // "backward <prefix>.<bn2_name_>": the join is outside main_, whose children get theirs.
  std::string bn2_span_;
  Shape out_;                  // per-sample output shape
  Loan main_out_, short_out_;  // kept from forward for backward (not under kInfer)
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(int64_t out, int64_t k, int64_t s, int64_t p, bool bias) {
  return std::make_unique<Conv2d>(out, k, s, p, bias);
}
std::unique_ptr<Layer> make_batchnorm2d(double momentum, double eps) {
  return std::make_unique<BatchNorm2d>(momentum, eps, false);
}
std::unique_ptr<Layer> make_batchnorm2d_relu(double momentum, double eps) {
  return std::make_unique<BatchNorm2d>(momentum, eps, true);
}
std::unique_ptr<Layer> make_relu() { return std::make_unique<ReLU>(); }
std::unique_ptr<Layer> make_avgpool2d(int k, int s) {
  return std::make_unique<AvgPool2d>(k, s, false);
}
std::unique_ptr<Layer> make_relu_avgpool2d(int k, int s) {
  return std::make_unique<AvgPool2d>(k, s, true);
}
std::unique_ptr<Layer> make_global_avgpool() { return std::make_unique<GlobalAvgPool>(); }
std::unique_ptr<Layer> make_flatten() { return std::make_unique<Flatten>(); }
std::unique_ptr<Layer> make_linear(int64_t out, bool bias) {
  return std::make_unique<Linear>(out, bias);
}
std::unique_ptr<Layer> make_maxpool2d(int kernel, int stride, int pad) {
  return std::make_unique<MaxPool2d>(kernel, stride, pad);
}
std::unique_ptr<Layer> make_residual(int64_t channels, bool use_1x1conv, int64_t stride,
                                     bool zero_init_residual) {
  auto main = std::make_unique<Sequential>();
  main->add("conv1", make_conv2d(channels, 3, stride, 1))
      .add("bn1", make_batchnorm2d_relu())
      .add("conv2", make_conv2d(channels, 3, 1, 1));
  return std::make_unique<Residual>(std::move(main), "bn2",
                                    zero_init_residual ? Init::kZeros : Init::kOnes,
                                    use_1x1conv ? make_conv2d(channels, 1, stride, 0) : nullptr);
}

namespace {
// torchvision's shortcut where the shape changes: downsample.0 (1x1 convolution at `stride`, no
// bias) and downsample.1 (BatchNorm), or none.
std::unique_ptr<Layer> tv_downsample(bool downsample, int64_t out, int64_t stride) {
  if (!downsample) return nullptr;
  auto s = std::make_unique<Sequential>();
  s->add("0", make_conv2d(out, 1, stride, 0, /*bias=*/false)).add("1", make_batchnorm2d());
  return s;
}
}  // namespace

std::unique_ptr<Layer> make_basic_block(int64_t planes, int64_t stride, bool downsample,
                                        bool zero_init_residual) {
  auto main = std::make_unique<Sequential>();
  main->add("conv1", make_conv2d(planes, 3, stride, 1, /*bias=*/false))
      .add("bn1", make_batchnorm2d_relu())
      .add("conv2", make_conv2d(planes, 3, 1, 1, /*bias=*/false));
  return std::make_unique<Residual>(std::move(main), "bn2",
                                    zero_init_residual ? Init::kZeros : Init::kOnes,
                                    tv_downsample(downsample, planes, stride));
}

std::unique_ptr<Layer> make_bottleneck(int64_t planes, int64_t stride, bool downsample,
                                       bool zero_init_residual) {
  auto main = std::make_unique<Sequential>();
  main->add("conv1", make_conv2d(planes, 1, 1, 0, /*bias=*/false))
      .add("bn1", make_batchnorm2d_relu())
      .add("conv2", make_conv2d(planes, 3, stride, 1, /*bias=*/false))
      .add("bn2", make_batchnorm2d_relu())
      .add("conv3", make_conv2d(4 * planes, 1, 1, 0, /*bias=*/false));
  return std::make_unique<Residual>(std::move(main), "bn3",
                                    zero_init_residual ? Init::kZeros : Init::kOnes,
                                    tv_downsample(downsample, 4 * planes, stride));
}
void set_batchnorm_sync(Layer& layer, const ChannelSumFn& fn) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&layer)) bn->set_sync(fn);
}
void set_pool(Layer& layer, TensorPool* pool) {
  if (auto* b = dynamic_cast<Borrower*>(&layer)) b->set_pool(pool);
}
int fold_conv_biases(Layer& net) {
  int folded = 0;
  net.visit([&](Layer& l) {
    if (auto* s = dynamic_cast<Sequential*>(&l))
      for (size_t i = 0; i + 1 < s->size(); ++i) folded += fold_pair(s->child(i), s->child(i + 1));
    else if (auto* r = dynamic_cast<Residual*>(&l))
      folded += r->fold_conv_bias();
  });
  return folded;
}

void Borrower::begin_backward(const char* kind) {
  DPT_CHECK(std::exchange(kept_, false),
            kind << ": backward without a forward that kept its activations (a "
                    "Mode::kInfer forward keeps none, and a backward hands them back)");
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
  out_shapes_.clear();
  for (auto& [name, layer] : children_) {
    s = layer->build(s, store, join(prefix, name));
    out_shapes_.push_back(s);
    span_names_.push_back("backward " +
                          (name.empty() ? join(prefix, layer->kind()) : join(prefix, name)));
  }
  acts_.resize(children_.size() - 1);
  return s;
}

void Sequential::forward(const Tensor& x, Tensor& y, Mode mode) {
  // Child i's output is borrowed: kept for backward (acts_[i]), which hands it back once child
  // i's backward is done; under kInfer handed back once child i + 1 has read it.
  const bool keep = begin_forward(mode);
  TensorPool& pool = this->pool();
  for (Loan& a : acts_) a.give_back();  // kept by a forward that had no backward
  const size_t n = children_.size();
  const int64_t batch = x.rank() > 0 ? x.dim(0) : 0;  // the first child checks x's shape
  Loan prev;                                          // child i - 1's output
  for (size_t i = 0; i < n; ++i) {
    Loan next = i + 1 == n ? Loan()
                           : Loan(pool, static_cast<size_t>(batch * shape_numel(out_shapes_[i])) *
                                            x.element_bytes());
    children_[i].second->forward(i == 0 ? x : *prev, i + 1 == n ? y : *next, mode);
    if (i > 0 && keep)
      acts_[i - 1] = std::move(prev);
    else
      prev.give_back();
    prev = std::move(next);
  }
  end_forward(keep);
}

void Sequential::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                          BackwardCtx& ctx) {
  begin_backward("Sequential");
  TensorPool& pool = this->pool();
  const size_t n = children_.size();
  // dL/d(output of child i), borrowed from the pool while child i's backward reads it; the last
  // child's is dy.
  Loan g;
  for (size_t i = n; i-- > 0;) {
    const Tensor& in = i == 0 ? x : *acts_[i - 1];
    const Tensor& out = i + 1 == n ? y : *acts_[i];
    Loan gin = i == 0 ? Loan() : Loan(pool, in.bytes());
    {
      TraceScope span(ctx.tracer, span_names_[i].c_str(), "backward");
      children_[i].second->backward(in, out, i + 1 == n ? dy : *g, i == 0 ? dx : &*gin, ctx);
    }
    g.give_back();
    if (i + 1 < n) acts_[i].give_back();  // its readers, children i and i + 1, are done
    g = std::move(gin);
  }
}

void Sequential::visit(const std::function<void(Layer&)>& fn) {
  fn(*this);
  for (auto& c : children_) c.second->visit(fn);
}

}  // namespace dpt
