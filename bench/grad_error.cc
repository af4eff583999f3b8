// One training step's gradients of a model on the fp32 CPU backend, written for an accuracy check
// against float64 PyTorch (bench/grad_error.py): the first --batch training images, BatchNorm in
// training mode (batch statistics), loss = mean softmax cross-entropy, backward from
// dlogits = (softmax - onehot) / batch. The output safetensors file holds every parameter and
// buffer as save_model writes them (PyTorch state_dict names and layouts; the buffers are the
// values before the step, so the running statistics are the initial ones) plus, for each
// parameter, "grad.<name>" in the same layout (= PyTorch's .grad), "input" ([N,1,H,W] floats as
// the model saw them), "labels" (I64) and "logits" ([N, classes]); the metadata records the loss
// (%.17g), the batch, seed, init and the ISA/Winograd settings. DPT_WINOGRAD=off, DPT_ISA=... and
// OMP_NUM_THREADS act as they do in dptrain: the library reads them itself.
//
// Diagnosis (--conv, --bn, --relu-masks): the layers run on a backend that forwards everything to
// the CPU backend (taking each signature from backend.h) except what these replace, to tell which
// operation's rounding the gradients carry:
//   --conv fwd=A,bwd_data=B,bwd_w=C  with A, B, C each `direct` (oneDNN, as DPT_WINOGRAD=off),
//        `wino2` / `wino4` / `wino6` (dptrain's Winograd with output tile F(2|4|6, 3), gradient
//        tile F(3, 2|4|6)) or `auto` (the library's own choice); only for the convolutions the
//        library would run as Winograd (stride 1, 3x3, >= 16 channels each way); the others stay
//        as they are. Sets DPT_WINOGRAD=off in this process so that `direct` is oneDNN's.
//   --bn f64  BatchNorm (statistics, normalisation, backward) in double, rounded once to float.
//   --relu-masks  also writes each ReLU's mask (output > 0) of the forward pass, bit-packed, as
//        "relu_mask.<i>" (U8, in call order, NHWC): grad_error.py --masks evaluates float64
//        PyTorch with these masks, to separate ReLU flips from rounding.
// Usage: build/bench/grad_error [--batch 256] [--seed 1] [--init d2l] [--model resnet18]
//                               [--data /usr/share/datasets/fashion-mnist] [--conv SPEC] [--bn f64]
//                               [--relu-masks] --out FILE
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/conv.h"
#include "cpu/gather.h"
#include "cpu/isa.h"
#include "cpu/ops.h"
#include "cpu/winograd.h"
#include "dpt/backend.h"
#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/safetensors.h"
#include "dpt/text.h"

namespace {

// ---- the diagnosis backend ---------------------------------------------------------------------

// How one convolution pass runs: 0 = the library's choice, -1 = oneDNN direct, m > 0 = Winograd
// with tile m (F(m, 3) for forward and backward-data, F(3, m) for the weight gradient).
struct ConvPlan {
  int fwd = 0, bwd_data = 0, bwd_w = 0;
  bool any() const { return fwd || bwd_data || bwd_w; }
};

int parse_pass(const std::string& v) {
  if (v == "auto") return 0;
  if (v == "direct") return -1;
  if (v == "wino2") return 2;
  if (v == "wino4") return 4;
  if (v == "wino6") return 6;
  throw dpt::Error(dpt::ErrorKind::kInput,
                   "--conv: '" + v + "' is not auto|direct|wino2|wino4|wino6");
}

ConvPlan parse_plan(const std::string& spec) {
  ConvPlan p;
  for (const std::string& item : dpt::split_list(spec, ',')) {
    const size_t eq = item.find('=');
    DPT_INPUT_CHECK(eq != std::string::npos, "--conv: '" << item << "' is not PASS=ALGO");
    const std::string key = item.substr(0, eq);
    const int v = parse_pass(item.substr(eq + 1));
    if (key == "fwd")
      p.fwd = v;
    else if (key == "bwd_data")
      p.bwd_data = v;
    else if (key == "bwd_w")
      p.bwd_w = v;
    else
      DPT_INPUT_CHECK(false, "--conv: unknown pass '" << key << "' (fwd|bwd_data|bwd_w)");
  }
  return p;
}

// The library's rule (src/cpu/winograd.cc winograd_choice) without its DPT_WINOGRAD switch.
bool library_would_use_winograd(const dpt::ConvGeom& g) {
  return g.stride == 1 && g.k == 3 && g.c_in >= 16 && g.c_out >= 16;
}

// This tool diagnoses float32 activations: the 16-bit forms of its replacement ops refuse.
[[noreturn]] void refuse_bf16() {
  DPT_CHECK(false, "grad_error diagnoses float32 activations only");
  std::abort();
}
struct Float32ConvOp : dpt::ConvOp {
  using BF = dpt::BFloat16;
  void forward(const dpt::ConvGeom&, const BF*, const float*, const float*, BF*) override {
    refuse_bf16();
  }
  void backward(const dpt::ConvGeom&, const BF*, const float*, const BF*, BF*, float*, float*,
                bool) override {
    refuse_bf16();
  }
};
struct Float32BatchNormOp : dpt::BatchNormOp {
  using BF = dpt::BFloat16;
  void forward_train(const BF*, BF*, int64_t, const float*, const float*, float*, float*, float*,
                     const dpt::ChannelSumFn&, const BF*, bool) override {
    refuse_bf16();
  }
  void forward_eval(const BF*, BF*, int64_t, const float*, const float*, const float*, const float*,
                    const BF*, bool) override {
    refuse_bf16();
  }
  void backward(const BF*, const BF*, BF*, int64_t, const float*, float*, float*, bool,
                const dpt::ChannelSumFn&, const BF*, BF*) override {
    refuse_bf16();
  }
};

// ConvPrimitives (oneDNN direct, DPT_WINOGRAD=off) or Winograd, pass by pass.
class PlannedConv : public Float32ConvOp {
 public:
  explicit PlannedConv(ConvPlan plan) : plan_(plan) {}
  void forward(const dpt::ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override {
    const int m = pick(g, plan_.fwd);
    if (m > 0) return wino_.forward(g, m, x, w, b, y);
    direct_.forward(g, x, w, b, y);
  }
  void backward(const dpt::ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override {
    const int md = pick(g, plan_.bwd_data), mw = pick(g, plan_.bwd_w);
    if (md <= 0 && mw <= 0) return direct_.backward(g, x, w, dy, dx, dw, db, accumulate);
    if (md > 0 && dx) wino_.backward_data(g, md, w, dy, dx);
    if (mw > 0) {
      if (md <= 0 &&
          dx) {  // direct backward-data: oneDNN computes weight (and bias) gradients too, dropped
        scratch_.resize(static_cast<size_t>(g.c_out * g.c_in * g.k * g.k + g.c_out));
        direct_.backward(g, x, w, dy, dx, scratch_.data(),
                         db ? scratch_.data() + g.c_out * g.c_in * g.k * g.k : nullptr, false);
      }
      wino_.backward_weights(g, mw, x, dy, dw, accumulate);
      if (db) dpt::cpu::column_sums(dy, g.n * g.oh() * g.ow(), g.c_out, db, accumulate);
    } else {
      direct_.backward(g, x, w, dy, nullptr, dw, db, accumulate);
    }
  }

 private:
  // 0 = direct; else the tile. `auto` is the library's rule with its tiles (4, 4).
  static int pick(const dpt::ConvGeom& g, int pass) {
    if (!library_would_use_winograd(g)) return 0;
    return pass == 0 ? 4 : pass < 0 ? 0 : pass;
  }
  ConvPlan plan_;
  dpt::cpu::ConvPrimitives direct_;
  dpt::cpu::WinogradConv wino_;
  std::vector<float> scratch_;
};

// BatchNorm with every intermediate in double (PyTorch's formulas), rounded to float once.
class F64BatchNorm : public Float32BatchNormOp {
 public:
  F64BatchNorm(int64_t c, double momentum, double eps) : c_(c), momentum_(momentum), eps_(eps) {}
  void forward_train(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                     float* rm, float* rv, float* nbt, const dpt::ChannelSumFn& sync,
                     const float* residual, bool relu) override {
    DPT_CHECK(!sync, "--bn f64 has no synchronised BatchNorm");
    mean_.assign(static_cast<size_t>(c_), 0.0);
    invstd_.assign(static_cast<size_t>(c_), 0.0);
    std::vector<double> var(static_cast<size_t>(c_), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < c_; ++ch) mean_[ch] += x[r * c_ + ch];
    for (int64_t ch = 0; ch < c_; ++ch) mean_[ch] /= static_cast<double>(m);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < c_; ++ch) {
        const double d = x[r * c_ + ch] - mean_[ch];
        var[ch] += d * d;
      }
    for (int64_t ch = 0; ch < c_; ++ch) {
      var[ch] /= static_cast<double>(m);
      invstd_[ch] = 1.0 / std::sqrt(var[ch] + eps_);
      rm[ch] = static_cast<float>((1 - momentum_) * rm[ch] + momentum_ * mean_[ch]);
      rv[ch] = static_cast<float>((1 - momentum_) * rv[ch] + momentum_ * var[ch] * m / (m - 1.0));
    }
    if (nbt) nbt[0] += 1.f;
    // The BatchNorm value rounded to float once, then the fused epilogue in float (backend.h).
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < c_; ++ch) {
        const int64_t i = r * c_ + ch;
        float v = static_cast<float>((x[i] - mean_[ch]) * invstd_[ch] * gamma[ch] + beta[ch]);
        if (residual) v = v + residual[i];
        if (relu) v = v > 0.f ? v : 0.f;
        y[i] = v;
      }
  }
  void forward_eval(const float*, float*, int64_t, const float*, const float*, const float*,
                    const float*, const float*, bool) override {
    DPT_CHECK(false, "--bn f64 is for training-mode steps only");
  }
  void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const dpt::ChannelSumFn&,
                const float* relu_out, float* dz_out) override {
    // The gradient BatchNorm takes: dy, or dy through the fused ReLU (backend.h).
    std::vector<float> masked;
    if (relu_out) {
      masked.resize(static_cast<size_t>(m * c_));
      dpt::cpu::relu_backward(relu_out, dy, masked.data(), m * c_);
      dy = masked.data();
      if (dz_out) std::copy(masked.begin(), masked.end(), dz_out);
    } else if (dz_out) {
      std::copy(dy, dy + m * c_, dz_out);
    }
    std::vector<double> sdy(static_cast<size_t>(c_), 0.0), sdyx(static_cast<size_t>(c_), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < c_; ++ch) {
        const double g = dy[r * c_ + ch];
        sdy[ch] += g;
        sdyx[ch] += g * (x[r * c_ + ch] - mean_[ch]) * invstd_[ch];
      }
    for (int64_t ch = 0; ch < c_; ++ch) {
      dgamma[ch] = static_cast<float>((accumulate ? dgamma[ch] : 0.0) + sdyx[ch]);
      dbeta[ch] = static_cast<float>((accumulate ? dbeta[ch] : 0.0) + sdy[ch]);
    }
    if (!dx) return;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < c_; ++ch) {
        const double xhat = (x[r * c_ + ch] - mean_[ch]) * invstd_[ch];
        dx[r * c_ + ch] = static_cast<float>(gamma[ch] * invstd_[ch] *
                                             (dy[r * c_ + ch] - sdy[ch] / m - xhat * sdyx[ch] / m));
      }
  }

 private:
  int64_t c_;
  double momentum_, eps_;
  std::vector<double> mean_, invstd_;
};

// A BatchNorm op that reports the output of its fused ReLU (BatchNorm2d+ReLU, the residual join)
// after each forward: the --relu-masks record of the ReLUs the layers no longer call separately.
class MaskReportingBatchNorm : public Float32BatchNormOp {
 public:
  using Report = std::function<void(const float* y, int64_t n)>;
  MaskReportingBatchNorm(std::unique_ptr<dpt::BatchNormOp> op, int64_t c, Report report)
      : op_(std::move(op)), c_(c), report_(std::move(report)) {}
  void forward_train(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                     float* rm, float* rv, float* nbt, const dpt::ChannelSumFn& sync,
                     const float* residual, bool relu) override {
    op_->forward_train(x, y, m, gamma, beta, rm, rv, nbt, sync, residual, relu);
    if (relu) report_(y, m * c_);
  }
  void forward_eval(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                    const float* rm, const float* rv, const float* residual, bool relu) override {
    op_->forward_eval(x, y, m, gamma, beta, rm, rv, residual, relu);
    if (relu) report_(y, m * c_);
  }
  void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const dpt::ChannelSumFn& sync,
                const float* relu_out, float* dz_out) override {
    op_->backward(x, dy, dx, m, gamma, dgamma, dbeta, accumulate, sync, relu_out, dz_out);
  }

 private:
  std::unique_ptr<dpt::BatchNormOp> op_;
  int64_t c_;
  Report report_;
};

// Everything is the CPU backend's but the convolutions (with a plan) and BatchNorm (with f64).
// The forwarding overrides take their signatures from backend.h itself (decltype of each member),
// so this file keeps compiling while that interface changes: one mixin per forwarded operation.
// An operation with a 16-bit overload names the signature of each form (GE_FORWARD_AS).
struct ForwardRoot : dpt::Backend {
  explicit ForwardRoot(dpt::Backend& base) : b_(&base) {}
  dpt::Backend& base() const { return *b_; }
  std::string name() const override { return b_->name(); }
  bool host_memory() const override { return b_->host_memory(); }
  void release(void* p) noexcept override { b_->release(p); }
  dpt::Backend* b_;
};
#define GE_FORWARD_AS(NAME, TAG, PREV, ...)                     \
  template <class Sig>                                          \
  struct Fwd_##TAG;                                             \
  template <class R, class... A>                                \
  struct Fwd_##TAG<R (dpt::Backend::*)(A...)> : PREV {          \
    using PREV::PREV;                                           \
    R NAME(A... a) override { return this->base().NAME(a...); } \
  };                                                            \
  using F_##TAG = Fwd_##TAG<__VA_ARGS__>;
#define GE_FORWARD(NAME, PREV) GE_FORWARD_AS(NAME, NAME, PREV, decltype(&dpt::Backend::NAME))
using BF = dpt::BFloat16;
using I = int64_t;
template <class... A>
using Op = void (dpt::Backend::*)(A...);
GE_FORWARD(allocate, ForwardRoot)
GE_FORWARD(zero, F_allocate)
GE_FORWARD(copy_to_host, F_zero)
GE_FORWARD(copy_from_host, F_copy_to_host)
GE_FORWARD(copy, F_copy_from_host)
GE_FORWARD_AS(relu_forward, relu_forward, F_copy, Op<const float*, float*, I>)
GE_FORWARD_AS(relu_forward, relu_forward16, F_relu_forward, Op<const BF*, BF*, I>)
GE_FORWARD_AS(relu_backward, relu_backward, F_relu_forward16,
              Op<const float*, const float*, float*, I>)
GE_FORWARD_AS(relu_backward, relu_backward16, F_relu_backward, Op<const BF*, const BF*, BF*, I>)
GE_FORWARD_AS(add, add, F_relu_backward16, Op<const float*, const float*, float*, I, bool>)
GE_FORWARD_AS(add, add16, F_add, Op<const BF*, const BF*, BF*, I, bool>)
GE_FORWARD_AS(avgpool_forward, avgpool_forward, F_add16,
              Op<const float*, float*, I, I, I, I, int, int, bool>)
GE_FORWARD_AS(avgpool_forward, avgpool_forward16, F_avgpool_forward,
              Op<const BF*, BF*, I, I, I, I, int, int, bool>)
GE_FORWARD_AS(avgpool_backward, avgpool_backward, F_avgpool_forward16,
              Op<const float*, const float*, float*, I, I, I, I, int, int>)
GE_FORWARD_AS(avgpool_backward, avgpool_backward16, F_avgpool_backward,
              Op<const BF*, const BF*, BF*, I, I, I, I, int, int>)
GE_FORWARD_AS(maxpool_forward, maxpool_forward, F_avgpool_backward16,
              Op<const float*, float*, I, I, I, I, int, int, int>)
GE_FORWARD_AS(maxpool_forward, maxpool_forward16, F_maxpool_forward,
              Op<const BF*, BF*, I, I, I, I, int, int, int>)
GE_FORWARD_AS(maxpool_backward, maxpool_backward, F_maxpool_forward16,
              Op<const float*, const float*, float*, I, I, I, I, int, int, int>)
GE_FORWARD_AS(maxpool_backward, maxpool_backward16, F_maxpool_backward,
              Op<const BF*, const BF*, BF*, I, I, I, I, int, int, int>)
GE_FORWARD_AS(global_avgpool_forward, global_avgpool_forward, F_maxpool_backward16,
              Op<const float*, float*, I, I, I>)
GE_FORWARD_AS(global_avgpool_forward, global_avgpool_forward16, F_global_avgpool_forward,
              Op<const BF*, BF*, I, I, I>)
GE_FORWARD_AS(global_avgpool_backward, global_avgpool_backward, F_global_avgpool_forward16,
              Op<const float*, float*, I, I, I>)
GE_FORWARD_AS(global_avgpool_backward, global_avgpool_backward16, F_global_avgpool_backward,
              Op<const BF*, BF*, I, I, I>)
GE_FORWARD_AS(flatten, flatten, F_global_avgpool_backward16,
              Op<const float*, float*, I, I, I, I, bool>)
GE_FORWARD_AS(flatten, flatten16, F_flatten, Op<const BF*, BF*, I, I, I, I, bool>)
GE_FORWARD_AS(linear_forward, linear_forward, F_flatten16,
              Op<const float*, const float*, const float*, float*, I, I, I>)
GE_FORWARD_AS(linear_forward, linear_forward16, F_linear_forward,
              Op<const BF*, const float*, const float*, BF*, I, I, I>)
GE_FORWARD_AS(linear_backward, linear_backward, F_linear_forward16,
              Op<const float*, const float*, const float*, float*, float*, float*, I, I, I, bool>)
GE_FORWARD_AS(linear_backward, linear_backward16, F_linear_backward,
              Op<const BF*, const float*, const BF*, BF*, float*, float*, I, I, I, bool>)
GE_FORWARD_AS(convert, convert, F_linear_backward16, Op<const float*, BF*, I>)
GE_FORWARD_AS(convert, convert16, F_convert, Op<const BF*, float*, I>)
GE_FORWARD(gather_images, F_convert16)
GE_FORWARD(softmax_xent, F_gather_images)
GE_FORWARD(store_scalar, F_softmax_xent)
GE_FORWARD(sgd_update, F_store_scalar)
GE_FORWARD(adamw_update, F_sgd_update)
GE_FORWARD(sum_squares, F_adamw_update)
GE_FORWARD(synchronize, F_sum_squares)
#undef GE_FORWARD
#undef GE_FORWARD_AS

class DiagnosisBackend : public F_synchronize {
 public:
  DiagnosisBackend(dpt::Backend& base, ConvPlan plan, bool bn64, bool masks)
      : F_synchronize(base), plan_(plan), bn64_(bn64), record_masks_(masks) {}
  // With masks: every ReLU's output > 0, bit-packed (little-endian bit order), in call order (the
  // ReLU layers, the ReLUs fused into BatchNorm and the residual joins': PyTorch's F.relu calls of
  // torch_ref.py, in order).
  void relu_forward(const float* x, float* y, int64_t n) override {
    base().relu_forward(x, y, n);
    record(y, n);
  }
  void add(const float* a, const float* b, float* y, int64_t n, bool relu) override {
    base().add(a, b, y, n, relu);
    if (relu) record(y, n);
  }
  const std::vector<std::pair<int64_t, std::vector<uint8_t>>>& masks() const { return masks_; }
  std::unique_ptr<dpt::ConvOp> make_conv() override {
    return plan_.any() ? std::make_unique<PlannedConv>(plan_) : base().make_conv();
  }
  std::unique_ptr<dpt::BatchNormOp> make_batchnorm(int64_t c, double momentum,
                                                   double eps) override {
    std::unique_ptr<dpt::BatchNormOp> op;
    if (bn64_)
      op = std::make_unique<F64BatchNorm>(c, momentum, eps);
    else
      op = base().make_batchnorm(c, momentum, eps);
    if (!record_masks_) return op;
    return std::make_unique<MaskReportingBatchNorm>(
        std::move(op), c, [this](const float* y, int64_t n) { record(y, n); });
  }

 private:
  void record(const float* y, int64_t n) {
    if (!record_masks_) return;
    base().synchronize();
    std::vector<uint8_t> bits(static_cast<size_t>((n + 7) / 8), 0);
    for (int64_t i = 0; i < n; ++i)
      if (y[i] > 0.f) bits[static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
    masks_.emplace_back(n, std::move(bits));
  }
  ConvPlan plan_;
  bool bn64_, record_masks_;
  std::vector<std::pair<int64_t, std::vector<uint8_t>>> masks_;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256;
  uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist", out, init = "d2l",
              model_name = "resnet18";
  std::string conv_spec, bn_mode;
  bool relu_masks = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--batch")
      batch = std::atoll(value().c_str());
    else if (a == "--seed")
      seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--data")
      data = value();
    else if (a == "--out")
      out = value();
    else if (a == "--init")
      init = value();
    else if (a == "--model")
      model_name = value();
    else if (a == "--conv")
      conv_spec = value();
    else if (a == "--bn")
      bn_mode = value();
    else if (a == "--relu-masks")
      relu_masks = true;
    else {
      std::fprintf(
          stderr,
          "usage: %s [--batch 256] [--seed 1] [--init d2l|kaiming] [--model resnet18|lenet] "
          "[--data DIR] [--conv fwd=A,bwd_data=B,bwd_w=C] [--bn f64] [--relu-masks] --out FILE\n",
          argv[0]);
      return 2;
    }
  }
  if (out.empty() || batch <= 0) {
    std::fprintf(stderr, "grad_error: --out FILE is required (and --batch > 0)\n");
    return 2;
  }
  try {
    DPT_INPUT_CHECK(bn_mode.empty() || bn_mode == "f64", "--bn: '" << bn_mode << "' is not f64");
    const ConvPlan plan = parse_plan(conv_spec);
    if (plan.any())
      setenv("DPT_WINOGRAD", "off", 1);  // `direct` must be oneDNN's; read on first use
    std::unique_ptr<DiagnosisBackend> diag;
    if (plan.any() || !bn_mode.empty() || relu_masks)
      diag = std::make_unique<DiagnosisBackend>(dpt::cpu_backend(), plan, bn_mode == "f64",
                                                relu_masks);
    dpt::Backend& be = diag ? static_cast<dpt::Backend&>(*diag) : dpt::cpu_backend();
    auto model = dpt::make_model(model_name, 10, be);
    model->init_parameters(init, seed);

    const dpt::ImageSet set = dpt::load_data(data, "auto").train;
    DPT_INPUT_CHECK(set.num_classes <= model->num_classes(),
                    data << ": labels of " << set.num_classes << " classes, the model has "
                         << model->num_classes());
    DPT_INPUT_CHECK(batch <= set.n, "--batch " << batch << " > " << set.n << " training images");
    const dpt::Shape& in_shape = model->input_shape();  // {H, W, C}
    const int64_t pixels = static_cast<int64_t>(set.images.size()) / set.n;
    DPT_INPUT_CHECK(pixels == dpt::shape_numel(in_shape), data << ": images of " << pixels
                                                               << " values, the model takes "
                                                               << dpt::shape_str(in_shape));
    std::vector<int64_t> idx(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) idx[static_cast<size_t>(i)] = i;
    dpt::Tensor x({batch, in_shape[0], in_shape[1], in_shape[2]});
    dpt::cpu::images_to_float(set.images.data(), set.n, pixels, idx.data(), batch, x.data());
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    std::vector<int64_t> labels64(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i)
      labels[i] = labels64[i] = set.labels[static_cast<size_t>(i)];

    // The values before the step (forward in training mode moves the running statistics).
    std::vector<dpt::StTensor> tensors;
    for (const auto& p : model->store().entries()) {
      if (p.is_counter) {
        const int64_t v = static_cast<int64_t>(std::llround(p.value.data()[0]));
        tensors.push_back(dpt::st_i64(p.name, p.shape, &v));
      } else {
        tensors.push_back(dpt::st_f32(p.name, p.shape, p.value.data()));
      }
    }

    const dpt::Tensor& logits = model->forward(x, dpt::Mode::kTrain);
    const int64_t k = model->num_classes();
    dpt::Tensor dlogits({batch, k});
    double sums[2] = {0, 0};
    be.softmax_xent(logits.data(), labels.data(), batch, k, 1.f / static_cast<float>(batch), 0.f,
                    dlogits.data(), sums, false);
    const double loss = sums[0] / static_cast<double>(batch);
    model->store().zero_grads();
    dpt::BackwardCtx ctx;
    model->backward(dlogits, ctx);
    be.synchronize();
    model->store().grads_to_host();

    // Gradients: the flat buffer's slice of each parameter, viewed with the parameter's own shape,
    // which is the layout save_model writes (PyTorch's OIHW convolution weights, [out, in] Linear).
    for (const auto& p : model->store().entries())
      if (!p.is_buffer) tensors.push_back(dpt::st_f32("grad." + p.name, p.shape, p.grad.data()));
    // NHWC with C = 1 is the same bytes as NCHW; for more channels transpose to NCHW.
    const int64_t h = in_shape[0], w = in_shape[1], c = in_shape[2];
    std::vector<float> nchw(static_cast<size_t>(x.numel()));
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < h * w; ++p)
          nchw[((n * c + ch) * h * w) + p] = x.data()[(n * h * w + p) * c + ch];
    tensors.push_back(dpt::st_f32("input", {batch, c, h, w}, nchw.data()));
    tensors.push_back(dpt::st_i64("labels", {batch}, labels64.data()));
    tensors.push_back(dpt::st_f32("logits", {batch, k}, logits.data()));
    if (diag)
      for (size_t i = 0; i < diag->masks().size(); ++i) {
        const auto& [n, bits] = diag->masks()[i];
        dpt::StTensor t{
            "relu_mask." + std::to_string(i), "U8", {static_cast<int64_t>(bits.size())}, bits};
        tensors.push_back(std::move(t));
      }

    char lossbuf[64];
    std::snprintf(lossbuf, sizeof lossbuf, "%.17g", loss);
    const char* wino = plan.any() ? "planned" : std::getenv("DPT_WINOGRAD");
    const char* omp = std::getenv("OMP_NUM_THREADS");
    std::map<std::string, std::string> meta{
        {"format", "dptrain-grad-error-v1"},
        {"model", model->name()},
        {"loss", lossbuf},
        {"batch", std::to_string(batch)},
        {"seed", std::to_string(seed)},
        {"init", init},
        {"isa", dpt::cpu::isa_report()},
        {"winograd", wino && *wino ? wino : "default"},
        {"omp_num_threads", omp && *omp ? omp : "default"},
        {"conv", conv_spec.empty() ? "library" : conv_spec},
        {"bn", bn_mode.empty() ? "library" : bn_mode},
    };
    dpt::write_safetensors(out, tensors, meta, "--out");
    std::printf("loss %.9g  (%s, DPT_WINOGRAD=%s, %zu tensors -> %s)\n", loss,
                dpt::cpu::isa_report().c_str(), wino && *wino ? wino : "default", tensors.size(),
                out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grad_error: %s\n", e.what());
    return 1;
  }
  return 0;
}
