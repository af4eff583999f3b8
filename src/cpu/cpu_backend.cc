// The CPU implementation of the operations interface (include/dpt/backend.h): host memory and the
// loops of src/cpu (oneDNN, Winograd and our own), called as they were before the interface
// existed, so the CPU's arithmetic is that of src/cpu and nothing else. Two instances: fp32, and
// --precision bf16 (cpu_backend.h), which differs only in its convolutions and Linear GEMMs; the
// bf16 detection, conversion and GEMM they need live here too.
#include "cpu/cpu_backend.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "cpu/conv.h"
#include "cpu/dnnl_util.h"
#include "cpu/gather.h"
#include "cpu/ops.h"
#include "cpu/widen.h"
#include "dpt/backend.h"
#include "dpt/clip.h"
#include "dpt/error.h"
#include "dpt/half.h"

namespace dpt::cpu {

namespace {

// Batch statistics in double: [sum(c), sumsq(c), rows] in one buffer, so synchronised BatchNorm
// needs one all-reduce; the mean and invstd of the last forward are kept for backward.
class CpuBatchNorm : public BatchNormOp {
 public:
  CpuBatchNorm(int64_t c, double momentum, double eps)
      : c_(c),
        momentum_(momentum),
        eps_(eps),
        mean_(static_cast<size_t>(c)),
        invstd_(static_cast<size_t>(c)) {}

  void forward_train(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                     float* running_mean, float* running_var, float* num_batches_tracked,
                     const ChannelSumFn& sync, const float* residual, bool relu) override {
    train(x, y, m, gamma, beta, running_mean, running_var, num_batches_tracked, sync, residual,
          relu);
  }
  void forward_eval(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, const float* residual,
                    bool relu) override {
    eval(x, y, m, gamma, beta, running_mean, running_var, residual, relu);
  }
  void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                const float* relu_out, float* dz_out) override {
    grad(x, dy, dx, m, gamma, dgamma, dbeta, accumulate, sync, relu_out, dz_out);
  }
  // 16-bit activations: the same code on ops.h's bfloat16 loops (the reference's bits).
  void forward_train(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                     const float* beta, float* running_mean, float* running_var,
                     float* num_batches_tracked, const ChannelSumFn& sync, const BFloat16* residual,
                     bool relu) override {
    train(x, y, m, gamma, beta, running_mean, running_var, num_batches_tracked, sync, residual,
          relu);
  }
  void forward_eval(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                    const float* beta, const float* running_mean, const float* running_var,
                    const BFloat16* residual, bool relu) override {
    eval(x, y, m, gamma, beta, running_mean, running_var, residual, relu);
  }
  void backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                const BFloat16* relu_out, BFloat16* dz_out) override {
    grad(x, dy, dx, m, gamma, dgamma, dbeta, accumulate, sync, relu_out, dz_out);
  }

 private:
  template <typename T>
  void train(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
             float* running_mean, float* running_var, float* num_batches_tracked,
             const ChannelSumFn& sync, const T* residual, bool relu) {
    const int64_t c = c_;
    std::vector<double> stats(static_cast<size_t>(2 * c + 1));
    bn_sums(x, m, c, stats.data(), stats.data() + c);
    stats[2 * c] = static_cast<double>(m);
    if (sync) sync(stats.data(), 2 * c + 1);
    const double count = stats[2 * c];
    count_ = count;
    for (int64_t ch = 0; ch < c; ++ch) {
      const double mean = stats[ch] / count;
      const double var = std::max(0.0, stats[c + ch] / count - mean * mean);
      mean_[ch] = static_cast<float>(mean);
      invstd_[ch] = static_cast<float>(1.0 / std::sqrt(var + eps_));
      const double unbiased = count > 1 ? var * count / (count - 1) : var;
      const double shift = mean_shift_ ? static_cast<double>(mean_shift_[ch]) : 0.0;
      running_mean[ch] =
          static_cast<float>((1 - momentum_) * running_mean[ch] + momentum_ * (mean + shift));
      running_var[ch] =
          static_cast<float>((1 - momentum_) * running_var[ch] + momentum_ * unbiased);
    }
    if (num_batches_tracked) num_batches_tracked[0] += 1.f;
    train_mode_ = true;
    bn_apply(x, y, mean_.data(), invstd_.data(), gamma, beta, m, c, residual, relu);
  }

  template <typename T>
  void eval(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
            const float* running_mean, const float* running_var, const T* residual, bool relu) {
    for (int64_t ch = 0; ch < c_; ++ch) {
      mean_[ch] = running_mean[ch];
      invstd_[ch] =
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(running_var[ch]) + eps_));
    }
    train_mode_ = false;
    bn_apply(x, y, mean_.data(), invstd_.data(), gamma, beta, m, c_, residual, relu);
  }

  template <typename T>
  void grad(const T* x, const T* dy, T* dx, int64_t m, const float* gamma, float* dgamma,
            float* dbeta, bool accumulate, const ChannelSumFn& sync, const T* relu_out, T* dz_out) {
    const int64_t c = c_;
    // With a fused ReLU the gradient BatchNorm takes is dz = dy masked by relu_out > 0: computed
    // in the sums pass (and stored when the caller wants it, or when the evaluation form below
    // needs it as an array), else masked again on the fly in the apply pass.
    std::vector<T> masked;
    if (relu_out && !dz_out && dx && !train_mode_) masked.resize(static_cast<size_t>(m * c));
    T* dz = dz_out ? dz_out : masked.empty() ? nullptr : masked.data();
    std::vector<double> sums(static_cast<size_t>(2 * c));
    bn_backward_sums(x, dy, relu_out, mean_.data(), invstd_.data(), m, c, sums.data(),
                     sums.data() + c, dz);
    const T* g = dz ? dz : dy;                // the gradient, masked or not
    const T* mask = dz ? nullptr : relu_out;  // the mask still to apply
    // Parameter gradients are this replica's own sums (the reducer adds the replicas up).
    for (int64_t ch = 0; ch < c; ++ch) {
      dgamma[ch] = static_cast<float>((accumulate ? dgamma[ch] : 0.0) + sums[c + ch]);
      dbeta[ch] = static_cast<float>((accumulate ? dbeta[ch] : 0.0) + sums[ch]);
    }
    if (dx && !train_mode_) {
      // Eval mode: the statistics are constants, so dx = dy * gamma * invstd.
      std::vector<float> zero(static_cast<size_t>(c), 0.f);
      bn_apply(g, dx, zero.data(), invstd_.data(), gamma, zero.data(), m, c,
               static_cast<const T*>(nullptr), false);
    } else if (dx) {
      // The input gradient needs the sums over every row the statistics were taken over.
      if (sync) sync(sums.data(), 2 * c);
      bn_backward_apply(x, g, mask, mean_.data(), invstd_.data(), gamma, sums.data(),
                        sums.data() + c, count_, m, c, dx);
    }
  }

  int64_t c_;
  double momentum_, eps_;
  std::vector<float> mean_, invstd_;
  double count_ = 0;
  bool train_mode_ = true;  // mode of the last forward: backward must match it
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(bool bf16) : bf16_(bf16) {}
  std::string name() const override { return "cpu"; }
  std::string describe() const override { return bf16_ ? "cpu (bf16)" : "cpu"; }
  bool host_memory() const override { return true; }

  void* allocate(size_t bytes) override {
    const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
    void* p = std::aligned_alloc(64, rounded);
    DPT_CHECK(p != nullptr, "out of memory allocating " << rounded << " bytes");
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy_to_host(void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
  }
  void copy_from_host(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  std::unique_ptr<ConvOp> make_conv() override {
    return std::make_unique<ConvPrimitives>(bf16_, &span_);
  }
  void weights_fixed(bool fixed) override {
    span_.set(fixed);
    // The bf16 weight copies not used in the span before are dropped (their models may be gone):
    // what is kept is one span's working set.
    if (fixed) std::erase_if(w16_, [&](const auto& kv) { return kv.second.span + 1 != span_.id; });
  }
  std::unique_ptr<BatchNormOp> make_batchnorm(int64_t channels, double momentum,
                                              double eps) override {
    return std::make_unique<CpuBatchNorm>(channels, momentum, eps);
  }
  // The activation operations, float and bfloat16 alike (ops.h's loops for both types).
  void relu_forward(const float* x, float* y, int64_t n) override { cpu::relu_forward(x, y, n); }
  void relu_backward(const float* y, const float* dy, float* dx, int64_t n) override {
    cpu::relu_backward(y, dy, dx, n);
  }
  void add(const float* a, const float* b, float* y, int64_t n, bool relu) override {
    add_t(a, b, y, n, relu);
  }
  void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                       int s, bool relu) override {
    avgpool_forward_t(x, y, n, h, w, c, k, s, relu);
  }
  void avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n, int64_t h,
                        int64_t w, int64_t c, int k, int s) override {
    avgpool_backward_t(dy, relu_input, dx, n, h, w, c, k, s);
  }
  void maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                       int s, int pad) override {
    cpu::maxpool_forward(x, y, n, h, w, c, k, s, pad);
  }
  void maxpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h, int64_t w,
                        int64_t c, int k, int s, int pad) override {
    cpu::maxpool_backward(x, dy, dx, n, h, w, c, k, s, pad);
  }
  void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) override {
    cpu::global_avgpool_forward(x, y, n, hw, c);
  }
  void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                               int64_t c) override {
    cpu::global_avgpool_backward(dy, dx, n, hw, c);
  }
  void flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
               bool to_chw) override {
    flatten_t(x, y, n, h, w, c, to_chw);
  }
  void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n,
                      int64_t in, int64_t out) override {
    cpu::linear_forward(x, w, b, y, n, in, out, gemm());
  }
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, int64_t n, int64_t in, int64_t out, bool accumulate) override {
    cpu::linear_backward(x, w, dy, dx, dw, db, n, in, out, accumulate, gemm());
  }

  // ---- 16-bit activations -----------------------------------------------------------------------
  // The scalar rounding, not VCVTNEPS2BF16 (which flushes subnormal inputs to zero): the GPU's
  // __float2bfloat16_rn keeps them, and the two backends must agree bit for bit.
  void convert(const float* x, BFloat16* y, int64_t n) override { round_to_bf16(x, y, n); }
  void convert(const BFloat16* x, float* y, int64_t n) override { widen_bf16(x, y, n); }
  void relu_forward(const BFloat16* x, BFloat16* y, int64_t n) override {
    cpu::relu_forward(x, y, n);
  }
  void relu_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t n) override {
    cpu::relu_backward(y, dy, dx, n);
  }
  void add(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n, bool relu) override {
    add_t(a, b, y, n, relu);
  }
  void avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       int k, int s, bool relu) override {
    avgpool_forward_t(x, y, n, h, w, c, k, s, relu);
  }
  void avgpool_backward(const BFloat16* dy, const BFloat16* relu_input, BFloat16* dx, int64_t n,
                        int64_t h, int64_t w, int64_t c, int k, int s) override {
    avgpool_backward_t(dy, relu_input, dx, n, h, w, c, k, s);
  }
  void maxpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       int k, int s, int pad) override {
    cpu::maxpool_forward(x, y, n, h, w, c, k, s, pad);
  }
  void maxpool_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n, int64_t h,
                        int64_t w, int64_t c, int k, int s, int pad) override {
    cpu::maxpool_backward(x, dy, dx, n, h, w, c, k, s, pad);
  }
  void global_avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t hw,
                              int64_t c) override {
    cpu::global_avgpool_forward(x, y, n, hw, c);
  }
  void global_avgpool_backward(const BFloat16* dy, BFloat16* dx, int64_t n, int64_t hw,
                               int64_t c) override {
    cpu::global_avgpool_backward(dy, dx, n, hw, c);
  }
  void flatten(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
               bool to_chw) override {
    flatten_t(x, y, n, h, w, c, to_chw);
  }
  // Linear on 16-bit activations. bf16 backend: oneDNN's matmul reads x, dy and the weights'
  // bf16 copy (made once per WeightSpan) and writes y (the bias added in fp32 first) and dx in
  // bf16, rounded once from its fp32 accumulators, as the convolutions do; dW accumulates in fp32.
  // fp32 backend: the float forms on widened copies (widen.h), the reference.
  void linear_forward(const BFloat16* x, const float* w, const float* b, BFloat16* y, int64_t n,
                      int64_t in, int64_t out) override {
    if (bf16_)
      return matmul_bf16('N', 'T', n, out, in, x, in, weights16(w, out * in), in, 0.f, y, out, b);
    Widened f;
    linear_forward(f.in(x, n * in), w, b, f.out(y, n * out), n, in, out);
  }
  void linear_backward(const BFloat16* x, const float* w, const BFloat16* dy, BFloat16* dx,
                       float* dw, float* db, int64_t n, int64_t in, int64_t out,
                       bool accumulate) override {
    if (bf16_) {
      if (dx) matmul_bf16('N', 'N', n, in, out, dy, out, weights16(w, out * in), in, 0.f, dx, in);
      matmul_bf16('T', 'N', out, in, n, dy, out, x, in, accumulate ? 1.f : 0.f, dw, in);
      if (db) column_sums(dy, n, out, db, accumulate);
      return;
    }
    Widened f;
    linear_backward(f.in(x, n * in), w, f.in(dy, n * out), f.out(dx, n * in), dw, db, n, in, out,
                    accumulate);
  }

  void gather_images(const uint8_t* images, const Label* labels, int64_t num_images,
                     const ImageBatchSpec& spec, const int64_t* idx, int64_t count, float* x,
                     int32_t* labels_out) override {
    gather_transformed(images, num_images, spec, idx, count, x);
    for (int64_t i = 0; i < count; ++i) labels_out[i] = labels[idx[i]];
  }
  void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float label_smoothing, float* dlogits, double* sums,
                    bool accumulate) override {
    int64_t hits = 0;
    const double loss =
        cpu::softmax_xent(logits, labels, n, k, grad_scale, dlogits, &hits, label_smoothing);
    sums[0] = (accumulate ? sums[0] : 0.0) + loss;
    sums[1] = (accumulate ? sums[1] : 0.0) + static_cast<double>(hits);
  }
  void store_scalar(float* dst, float v) override { *dst = v; }
  void sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr, float momentum,
                  float weight_decay, bool nesterov, bool first, const double* grad_sumsq,
                  float clip_norm) override {
    float coef = 1.f;
    if (!guard_and_clip(grad_sumsq, clip_norm, &coef)) return;
    cpu::sgd_update(p, g, buf, n, *lr, momentum, weight_decay, first, coef, nesterov);
  }
  void adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n,
                    const float* lr, double* step, bool count_step, double beta1, double beta2,
                    double eps, double weight_decay, const double* grad_sumsq,
                    float clip_norm) override {
    float coef = 1.f;
    if (!guard_and_clip(grad_sumsq, clip_norm, &coef)) return;
    const double t = *step + 1;
    cpu::adamw_update(p, g, exp_avg, exp_avg_sq, n,
                      cpu::adamw_scalars(*lr, t, beta1, beta2, eps, weight_decay, coef));
    if (count_step) *step = t;
  }
  void sum_squares(const float* x, int64_t n, double* out) override {
    *out = cpu::sum_squares(x, n);
  }

 private:
  // The optimizers' non-finite guard (false: skip the step) and clip coefficient (Backend::
  // sgd_update).
  static bool guard_and_clip(const double* grad_sumsq, float clip_norm, float* coef) {
    *coef = 1.f;
    if (!grad_sumsq) return true;
    if (!std::isfinite(*grad_sumsq))
      return false;  // the non-finite guard: this step changes nothing
    *coef = clip_coefficient(*grad_sumsq, clip_norm);
    return true;
  }
  // The operations above that choose between two loops, for either element type.
  template <typename T>
  static void add_t(const T* a, const T* b, T* y, int64_t n, bool relu) {
    cpu::add(a, b, y, n);
    if (relu) cpu::relu_forward(y, y, n);  // rounding commutes with the ReLU: the same bits
  }
  template <typename T>
  static void avgpool_forward_t(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                                int s, bool relu) {
    if (relu)
      cpu::relu_avgpool_forward(x, y, n, h, w, c, k, s);
    else
      cpu::avgpool_forward(x, y, n, h, w, c, k, s);
  }
  template <typename T>
  static void avgpool_backward_t(const T* dy, const T* relu_input, T* dx, int64_t n, int64_t h,
                                 int64_t w, int64_t c, int k, int s) {
    if (relu_input)
      cpu::relu_avgpool_backward(relu_input, dy, dx, n, h, w, c, k, s);
    else
      cpu::avgpool_backward(dy, dx, n, h, w, c, k, s);
  }
  template <typename T>
  static void flatten_t(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, bool to_chw) {
    if (to_chw)
      cpu::nhwc_to_chw(x, y, n, h, w, c);
    else
      cpu::chw_to_nhwc(x, y, n, h, w, c);
  }
  GemmFn gemm() const { return bf16_ ? gemm_bf16 : sgemm; }
  // The bf16 copy of the n weights at w: made once per WeightSpan (VCVTNEPS2BF16, as gemm_bf16
  // rounds its operands), afresh on every call outside one.
  const BFloat16* weights16(const float* w, int64_t n) {
    Weights16& c = w16_[w];
    if (!span_.holds(c.span, c.of, w) || c.v.size() != static_cast<size_t>(n)) {
      c.v.resize(static_cast<size_t>(n));
      to_bf16(w, reinterpret_cast<uint16_t*>(c.v.data()), n);
      c.of = w;
      c.span = span_.current();
    }
    return c.v.data();
  }
  struct Weights16 {
    std::vector<BFloat16> v;
    const float* of = nullptr;
    uint64_t span = 0;
  };
  bool bf16_;  // --precision bf16: convolutions and Linear GEMMs on bf16 operands
  WeightSpan span_;
  std::map<const float*, Weights16> w16_;
};

// 16 floats per VCVTNEPS2BF16, the tail under a mask, so every element is rounded the same way.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void to_bf16_avx512(const float* x,
                                                                                    uint16_t* y,
                                                                                    int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(y + i, m, reinterpret_cast<const __m256i&>(v));
  }
}

// The first "model name" of /proc/cpuinfo, for messages.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find_first_not_of(" \t", line.find(':') + 1));
  return "this CPU";
}

}  // namespace

std::string cpu_bf16_missing() {
  const char* env = std::getenv("DPT_CPU_BF16");
  const bool off = env && std::string(env) == "off";
  // Another value (1, yes, on) was ignored without a word: the test or diagnosis ran as if unset.
  DPT_INPUT_CHECK(!env || !*env || off, "DPT_CPU_BF16=" << env << ": expected off (or unset)");
  const bool avx512 = !off && __builtin_cpu_supports("avx512bf16");
  const bool amx = !off && __builtin_cpu_supports("amx-bf16");
  if (!avx512 && !amx)
    return DPT_MSG(cpu_model() << " has neither AVX512-BF16 nor AMX-BF16"
                               << (off ? " (DPT_CPU_BF16=off treats them as absent)" : ""));
  // A CPU feature oneDNN may not use (ONEDNN_MAX_CPU_ISA) would leave its reference kernels.
  const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & need) != need)
    return DPT_MSG(
        cpu_model() << " has " << (avx512 ? "AVX512-BF16" : "AMX-BF16")
                    << " but oneDNN may not use it (its ISA is capped below avx512_core_bf16, "
                       "by ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA)");
  return "";
}

Backend& cpu_backend_bf16() {
  static CpuBackend backend(true);
  return backend;
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  static const bool native = __builtin_cpu_supports("avx512bf16") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (native) return to_bf16_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_from_float(x[i]);
}

template <typename C>
void matmul_bf16(char ta, char tb, int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
                 const BFloat16* b, int64_t ldb, float beta, C* c, int64_t ldc, const float* bias) {
  DPT_CHECK(beta == 0.f || beta == 1.f, "matmul_bf16: beta " << beta << " is neither 0 nor 1");
  using dnnl::memory;
  using dt = memory::data_type;
  // op(A) [m, k] and op(B) [k, n] as strided views of the row-major operands (a transposed one is
  // the same bytes read across).
  auto view = [](char t, int64_t rows, int64_t cols, int64_t ld) {
    return t == 'N' ? memory::desc({rows, cols}, dt::bf16, memory::dims{ld, 1})
                    : memory::desc({rows, cols}, dt::bf16, memory::dims{1, ld});
  };
  constexpr bool c16 = std::is_same_v<C, BFloat16>;
  using Key = std::tuple<char, char, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                         bool, bool>;
  thread_local std::map<Key, dnnl::matmul> cache;
  const memory::desc a_md = view(ta, m, k, lda), b_md = view(tb, k, n, ldb);
  const memory::desc c_md({m, n}, c16 ? dt::bf16 : dt::f32, memory::dims{ldc, 1});
  const memory::desc bias_md({1, n}, dt::f32, memory::dims{n, 1});
  const Key key{ta, tb, m, n, k, lda, ldb, ldc, beta != 0.f, c16, bias != nullptr};
  auto it = cache.find(key);
  if (it == cache.end()) {
    dnnl::primitive_attr attr;
    if (beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(1.f);  // C += the product: the accumulation of a gradient
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(a_md, b_md, bias ? bias_md : memory::desc(), c_md), attr, dnnl_engine());
    log_dnnl_choice("matmul bf16", pd.impl_info_str());
    it = cache.emplace(key, dnnl::matmul(pd)).first;
  }
  auto& eng = dnnl_engine();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(a_md, eng, const_cast<BFloat16*>(a))},
      {DNNL_ARG_WEIGHTS, memory(b_md, eng, const_cast<BFloat16*>(b))},
      {DNNL_ARG_DST, memory(c_md, eng, c)}};
  if (bias) args[DNNL_ARG_BIAS] = memory(bias_md, eng, const_cast<float*>(bias));
  it->second.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}
template void matmul_bf16(char, char, int64_t, int64_t, int64_t, const BFloat16*, int64_t,
                          const BFloat16*, int64_t, float, float*, int64_t, const float*);
template void matmul_bf16(char, char, int64_t, int64_t, int64_t, const BFloat16*, int64_t,
                          const BFloat16*, int64_t, float, BFloat16*, int64_t, const float*);

void gemm_bf16(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // The extent each operand occupies: its rows up to the last one's end.
  auto extent = [](char t, int64_t rows, int64_t cols, int64_t ld) {
    return t == 'N' ? (rows - 1) * ld + cols : (cols - 1) * ld + rows;
  };
  thread_local std::vector<BFloat16> a16, b16;
  a16.resize(static_cast<size_t>(extent(ta, m, k, lda)));
  b16.resize(static_cast<size_t>(extent(tb, k, n, ldb)));
  to_bf16(a, reinterpret_cast<uint16_t*>(a16.data()), static_cast<int64_t>(a16.size()));
  to_bf16(b, reinterpret_cast<uint16_t*>(b16.data()), static_cast<int64_t>(b16.size()));
  matmul_bf16(ta, tb, m, n, k, a16.data(), lda, b16.data(), ldb, beta, c, ldc);
}

}  // namespace dpt::cpu

namespace dpt {

Backend& cpu_backend() {
  static cpu::CpuBackend backend(false);
  return backend;
}

}  // namespace dpt
