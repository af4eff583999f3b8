// Entry points of ops.h's hand-written loops (ReLU, residual add, pooling, BatchNorm, flatten,
// column sums, im2col/col2im, SGD, sum of squares, softmax cross-entropy): the loops themselves are
// in ops_loops.inc, compiled for each level of isa.h (those over activations for float and for
// bfloat16), and each call runs the copy of the level isa.cc chose (one table lookup per call, not
// per element).
#include "cpu/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/isa.h"
#include "dpt/half.h"

namespace dpt::cpu {

namespace {

// One level's copies of the loops over activations, for one element type T (float or BFloat16);
// the types are ops.h's own declarations.
template <typename T>
struct ActivationLoops {
  decltype(&cpu::relu_forward<T>) relu_forward;
  decltype(&cpu::relu_backward<T>) relu_backward;
  decltype(&cpu::add<T>) add;
  decltype(&cpu::avgpool_forward<T>) avgpool_forward;
  decltype(&cpu::avgpool_backward<T>) avgpool_backward;
  decltype(&cpu::relu_avgpool_forward<T>) relu_avgpool_forward;
  decltype(&cpu::relu_avgpool_backward<T>) relu_avgpool_backward;
  decltype(&cpu::maxpool_forward<T>) maxpool_forward;
  decltype(&cpu::maxpool_backward<T>) maxpool_backward;
  decltype(&cpu::global_avgpool_forward<T>) global_avgpool_forward;
  decltype(&cpu::global_avgpool_backward<T>) global_avgpool_backward;
  decltype(&cpu::bn_sums<T>) bn_sums;
  decltype(&cpu::bn_apply<T>) bn_apply;
  decltype(&cpu::bn_backward_sums<T>) bn_backward_sums;
  decltype(&cpu::bn_backward_apply<T>) bn_backward_apply;
  decltype(&cpu::nhwc_to_chw<T>) nhwc_to_chw;
  decltype(&cpu::chw_to_nhwc<T>) chw_to_nhwc;
  decltype(&cpu::column_sums<T>) column_sums;
};

// One level's copies of every loop.
struct Loops {
  ActivationLoops<float> f32;
  ActivationLoops<BFloat16> bf16;
  decltype(&cpu::add_inplace) add_inplace;
  decltype(&cpu::round_to_bf16) round_to_bf16;
  decltype(&cpu::widen_bf16) widen_bf16;
  decltype(&cpu::im2col_nhwc) im2col_nhwc;
  decltype(&cpu::col2im_nhwc) col2im_nhwc;
  decltype(&cpu::sgd_update) sgd_update;
  decltype(&cpu::adamw_update) adamw_update;
  decltype(&cpu::sum_squares) sum_squares;
  decltype(&cpu::softmax_xent) softmax_xent;
};

#define DPT_ISA_LOOPS "cpu/ops_loops.inc"
#include "cpu/isa_targets.inc"
#undef DPT_ISA_LOOPS

const Loops kByIsa[] = {isa_generic::kLoops, isa_avx2::kLoops, isa_avx512::kLoops};
const Loops& loops() { return for_active_isa(kByIsa); }

// The active level's loops over activations of type T.
template <typename T>
const ActivationLoops<T>& act() {
  if constexpr (std::is_same_v<T, float>)
    return loops().f32;
  else
    return loops().bf16;
}

}  // namespace

template <typename T>
void relu_forward(const T* x, T* y, int64_t n) {
  act<T>().relu_forward(x, y, n);
}
template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n) {
  act<T>().relu_backward(y, dy, dx, n);
}
template <typename T>
void add(const T* a, const T* b, T* y, int64_t n) {
  act<T>().add(a, b, y, n);
}
void add_inplace(float* y, const float* b, int64_t n) { loops().add_inplace(y, b, n); }
void round_to_bf16(const float* x, BFloat16* y, int64_t n) { loops().round_to_bf16(x, y, n); }
void widen_bf16(const BFloat16* x, float* y, int64_t n) { loops().widen_bf16(x, y, n); }

template <typename T>
void avgpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s) {
  act<T>().avgpool_forward(x, y, n, h, w, c, k, s);
}
template <typename T>
void avgpool_backward(const T* dy, T* dx, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                      int s) {
  act<T>().avgpool_backward(dy, dx, n, h, w, c, k, s);
}
template <typename T>
void relu_avgpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                          int s) {
  act<T>().relu_avgpool_forward(x, y, n, h, w, c, k, s);
}
template <typename T>
void relu_avgpool_backward(const T* x, const T* dy, T* dx, int64_t n, int64_t h, int64_t w,
                           int64_t c, int k, int s) {
  act<T>().relu_avgpool_backward(x, dy, dx, n, h, w, c, k, s);
}
template <typename T>
void maxpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                     int pad) {
  act<T>().maxpool_forward(x, y, n, h, w, c, k, s, pad);
}
template <typename T>
void maxpool_backward(const T* x, const T* dy, T* dx, int64_t n, int64_t h, int64_t w, int64_t c,
                      int k, int s, int pad) {
  act<T>().maxpool_backward(x, dy, dx, n, h, w, c, k, s, pad);
}
template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t n, int64_t hw, int64_t c) {
  act<T>().global_avgpool_forward(x, y, n, hw, c);
}
template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t n, int64_t hw, int64_t c) {
  act<T>().global_avgpool_backward(dy, dx, n, hw, c);
}

template <typename T>
void bn_sums(const T* x, int64_t m, int64_t c, double* sum, double* sumsq) {
  act<T>().bn_sums(x, m, c, sum, sumsq);
}
template <typename T>
void bn_apply(const T* x, T* y, const float* mean, const float* invstd, const float* gamma,
              const float* beta, int64_t m, int64_t c, Opt<T> residual, bool relu) {
  act<T>().bn_apply(x, y, mean, invstd, gamma, beta, m, c, residual, relu);
}
template <typename T>
void bn_backward_sums(const T* x, const T* dy, Opt<T> relu_out, const float* mean,
                      const float* invstd, int64_t m, int64_t c, double* sum_dy,
                      double* sum_dy_xhat, OptOut<T> dz) {
  act<T>().bn_backward_sums(x, dy, relu_out, mean, invstd, m, c, sum_dy, sum_dy_xhat, dz);
}
template <typename T>
void bn_backward_apply(const T* x, const T* dy, Opt<T> relu_out, const float* mean,
                       const float* invstd, const float* gamma, const double* sum_dy,
                       const double* sum_dy_xhat, double count, int64_t m, int64_t c, T* dx) {
  act<T>().bn_backward_apply(x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c,
                             dx);
}
template <typename T>
void nhwc_to_chw(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c) {
  act<T>().nhwc_to_chw(x, y, n, h, w, c);
}
template <typename T>
void chw_to_nhwc(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c) {
  act<T>().chw_to_nhwc(x, y, n, h, w, c);
}

template <typename T>
void column_sums(const T* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  act<T>().column_sums(a, rows, cols, out, accumulate);
}

// The two element types of ops.h's activation templates.
#define DPT_ACTIVATION_LOOPS(T)                                                                   \
  template void relu_forward(const T*, T*, int64_t);                                              \
  template void relu_backward(const T*, const T*, T*, int64_t);                                   \
  template void add(const T*, const T*, T*, int64_t);                                             \
  template void avgpool_forward(const T*, T*, int64_t, int64_t, int64_t, int64_t, int, int);      \
  template void avgpool_backward(const T*, T*, int64_t, int64_t, int64_t, int64_t, int, int);     \
  template void relu_avgpool_forward(const T*, T*, int64_t, int64_t, int64_t, int64_t, int, int); \
  template void relu_avgpool_backward(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, \
                                      int, int);                                                  \
  template void maxpool_forward(const T*, T*, int64_t, int64_t, int64_t, int64_t, int, int, int); \
  template void maxpool_backward(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, int, \
                                 int, int);                                                       \
  template void global_avgpool_forward(const T*, T*, int64_t, int64_t, int64_t);                  \
  template void global_avgpool_backward(const T*, T*, int64_t, int64_t, int64_t);                 \
  template void bn_sums(const T*, int64_t, int64_t, double*, double*);                            \
  template void bn_apply(const T*, T*, const float*, const float*, const float*, const float*,    \
                         int64_t, int64_t, const T*, bool);                                       \
  template void bn_backward_sums(const T*, const T*, const T*, const float*, const float*,        \
                                 int64_t, int64_t, double*, double*, T*);                         \
  template void bn_backward_apply(const T*, const T*, const T*, const float*, const float*,       \
                                  const float*, const double*, const double*, double, int64_t,    \
                                  int64_t, T*);                                                   \
  template void nhwc_to_chw(const T*, T*, int64_t, int64_t, int64_t, int64_t);                    \
  template void chw_to_nhwc(const T*, T*, int64_t, int64_t, int64_t, int64_t);                    \
  template void column_sums(const T*, int64_t, int64_t, float*, bool);
DPT_ACTIVATION_LOOPS(float)
DPT_ACTIVATION_LOOPS(BFloat16)
#undef DPT_ACTIVATION_LOOPS

void im2col_nhwc(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* col) {
  loops().im2col_nhwc(x, n, h, w, c, k, stride, pad, col);
}
void col2im_nhwc(const float* dcol, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* dx) {
  loops().col2im_nhwc(dcol, n, h, w, c, k, stride, pad, dx);
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay, bool first, float coef, bool nesterov) {
  loops().sgd_update(p, g, buf, n, lr, momentum, weight_decay, first, coef, nesterov);
}
AdamWScalars adamw_scalars(double lr, double t, double beta1, double beta2, double eps,
                           double weight_decay, float coef) {
  const double bias1 = 1.0 - std::pow(beta1, t), bias2 = 1.0 - std::pow(beta2, t);
  return {.decay = static_cast<float>(1.0 - lr * weight_decay),
          .beta1 = static_cast<float>(beta1),
          .beta1c = static_cast<float>(1.0 - beta1),
          .beta2 = static_cast<float>(beta2),
          .beta2c = static_cast<float>(1.0 - beta2),
          .step_size = static_cast<float>(lr / bias1),
          .bias2_sqrt = static_cast<float>(std::sqrt(bias2)),
          .eps = static_cast<float>(eps),
          .coef = coef};
}
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  loops().adamw_update(p, g, m, v, n, s);
}
double sum_squares(const float* x, int64_t n) { return loops().sum_squares(x, n); }
double softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float* dlogits, int64_t* correct, float label_smoothing) {
  return loops().softmax_xent(logits, labels, n, k, grad_scale, dlogits, correct, label_smoothing);
}

}  // namespace dpt::cpu
