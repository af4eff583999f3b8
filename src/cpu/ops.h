// CPU backend: the element-wise, pooling, normalisation, matrix and loss kernels of every layer
// (convolution lives in conv.h). 4-D tensors are NHWC; all pointers are dense, non-aliasing.
// These loops are also the reference the GPU backend is tested against.
//
// The loops over activations are templates for T = float and T = BFloat16 (16-bit activations,
// backend.h's rule): a bfloat16 loop reads its inputs widened, computes in float exactly what the
// float loop computes, and rounds each output to nearest even (subnormals kept), in one pass. So
// it gives the bits of the reference form (widen.h: float copies, the float loop, rounding).
#pragma once

#include <cstdint>
#include <type_traits>

#include "dpt/half.h"

namespace dpt::cpu {

// The optional (nullable) array parameters: T is deduced from the others, so a caller may pass a
// plain nullptr.
template <typename T>
using Opt = std::type_identity_t<const T>*;
template <typename T>
using OptOut = std::type_identity_t<T>*;

template <typename T>
void relu_forward(const T* x, T* y, int64_t n);
// dx = dy where y > 0 (y is the forward output), else 0.
template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n);
template <typename T>
void add(const T* a, const T* b, T* y, int64_t n);
void add_inplace(float* y, const float* b, int64_t n);

// k x k window, stride s, no padding, floor mode: [N,H,W,C] -> [N,(H-k)/s+1,(W-k)/s+1,C].
template <typename T>
void avgpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s);
// dx is overwritten (positions no window covers get 0).
template <typename T>
void avgpool_backward(const T* dy, T* dx, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s);
// y = avgpool(relu(x)) in one pass: the ReLU output is never written (LeNet's conv-ReLU-pool).
template <typename T>
void relu_avgpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                          int s);
// dx = (x > 0) * avgpool_backward(dy), one pass per image; uncovered positions get 0.
template <typename T>
void relu_avgpool_backward(const T* x, const T* dy, T* dx, int64_t n, int64_t h, int64_t w,
                           int64_t c, int k, int s);
// Max pooling, PyTorch's max_pool2d: k x k windows at stride s over the input padded by `pad` on
// each side (pad < k; padded positions never win), floor mode: [N,H,W,C] ->
// [N,(H+2pad-k)/s+1,(W+2pad-k)/s+1,C]. The winner of a window, per channel, is its first maximum in
// row-major order, a NaN winning over any number (PyTorch's `v > max || isnan(v)`).
template <typename T>
void maxpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                     int pad);
// dx (overwritten) = the sum, over the windows a position wins (the winners recomputed from x, by
// the forward's rule), of their output gradients, added in row-major output order; 0 elsewhere.
template <typename T>
void maxpool_backward(const T* x, const T* dy, T* dx, int64_t n, int64_t h, int64_t w, int64_t c,
                      int k, int s, int pad);
// [N,H,W,C] -> [N,C] mean over H*W.
template <typename T>
void global_avgpool_forward(const T* x, T* y, int64_t n, int64_t hw, int64_t c);
template <typename T>
void global_avgpool_backward(const T* dy, T* dx, int64_t n, int64_t hw, int64_t c);

// BatchNorm over rows of a [M, C] view (M = N*H*W for NHWC). Split into local sums and an apply
// step so synchronised BatchNorm can all-reduce the sums in between.
template <typename T>
void bn_sums(const T* x, int64_t m, int64_t c, double* sum, double* sumsq);
// y = x * scale + shift (scale = gamma*invstd, shift = beta - mean*scale), then the fused epilogue:
// + residual[r, c] when residual is not null, then max(., 0) when relu. Each step rounds as the
// separate add() and relu_forward() would, so the fused result is theirs bit for bit.
template <typename T>
void bn_apply(const T* x, T* y, const float* mean, const float* invstd, const float* gamma,
              const float* beta, int64_t m, int64_t c, Opt<T> residual, bool relu);
// sum_dy[c] = sum g, sum_dy_xhat[c] = sum g * (x - mean) * invstd (local rows only), where g is dy,
// or with relu_out (the fused ReLU's output) relu_backward's (relu_out > 0 ? dy : 0); dz (nullable)
// receives g (the masked gradient a residual join's other path needs too).
template <typename T>
void bn_backward_sums(const T* x, const T* dy, Opt<T> relu_out, const float* mean,
                      const float* invstd, int64_t m, int64_t c, double* sum_dy,
                      double* sum_dy_xhat, OptOut<T> dz);
// dx = gamma * invstd * (g - sum_dy/count - xhat * sum_dy_xhat/count), count = rows over all
// replicas, g = dy masked by relu_out > 0 when relu_out is not null (as bn_backward_sums).
template <typename T>
void bn_backward_apply(const T* x, const T* dy, Opt<T> relu_out, const float* mean,
                       const float* invstd, const float* gamma, const double* sum_dy,
                       const double* sum_dy_xhat, double count, int64_t m, int64_t c, T* dx);

// Row-major C = op(A) op(B) + beta C through oneDNN's sgemm (OpenMP threads), checked.
void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out[c] (+)= sum over rows of a[r, c], in one row-major pass with double accumulators (bias
// gradients of Linear and of the sgemm convolution path; a[] float or 16-bit activations).
template <typename T>
void column_sums(const T* a, int64_t rows, int64_t cols, float* out, bool accumulate);

// Float to bfloat16 by bf16_from_float's rule (nearest even, subnormals kept, NaN quietened), and
// back (exact): the 16-bit activations' conversions (Backend::convert), vectorised per level.
void round_to_bf16(const float* x, BFloat16* y, int64_t n);
void widen_bf16(const BFloat16* x, float* y, int64_t n);

// A GEMM with sgemm's contract: Linear's products go through one, so --precision bf16 can hand
// in its bf16 GEMM (cpu_backend.h) while the bias and its gradient stay fp32 loops here.
using GemmFn = void (*)(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                        int64_t ldc);

// y[n,out] = x[n,in] * W[out,in]^T + b.
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in,
                    int64_t out, GemmFn gemm = sgemm);
// dx (optional) = dy W; dW (+)= dy^T x; db (+)= sum_n dy. accumulate: add into dW/db.
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, int64_t n, int64_t in, int64_t out, bool accumulate,
                     GemmFn gemm = sgemm);

// The columns of a k x k convolution (stride, pad) over NHWC x[n,h,w,c]: col[(n, oh, ow), (kh, kw,
// c)], zeros where the window hangs over the padding; col2im_nhwc is its adjoint: dx (overwritten)
// = the columns added back at their input positions. The sgemm backward path of conv.cc.
void im2col_nhwc(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* col);
void col2im_nhwc(const float* dcol, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* dx);

// NHWC [N,H,W,C] <-> [N, C*H*W] in (c, h, w) order, PyTorch's flatten order.
template <typename T>
void nhwc_to_chw(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c);
template <typename T>
void chw_to_nhwc(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c);

// PyTorch's SGD step over n floats (buf unused when momentum is 0), gradients scaled by `coef`
// (clipping; 1: none), Nesterov momentum when asked; see Backend::sgd_update.
void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay, bool first, float coef = 1.f, bool nesterov = false);
// The scalars of one torch.optim.AdamW step, each formed in double and rounded to float as
// PyTorch's Python scalars are (adamw_scalars).
struct AdamWScalars {
  float decay;          // 1 - lr wd
  float beta1, beta1c;  // b1, 1 - b1
  float beta2, beta2c;  // b2, 1 - b2
  float step_size;      // lr / (1 - b1^t)
  float bias2_sqrt;     // sqrt(1 - b2^t)
  float eps;
  float coef;  // the gradients' scale (clipping; 1: none)
};
AdamWScalars adamw_scalars(double lr, double t, double beta1, double beta2, double eps,
                           double weight_decay, float coef);
// AdamW's element-wise step over n floats: d = coef g; p *= decay; m = b1 m + (1-b1) d;
// v = b2 v + (1-b2) d d; p -= step_size m / (sqrt(v) / bias2_sqrt + eps). See
// Backend::adamw_update.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);
// Sum of x[i]^2 in double, in a fixed order.
double sum_squares(const float* x, int64_t n);

// Softmax cross-entropy on logits [N,K] with label smoothing e (0: none; Backend::softmax_xent):
// returns the summed loss; *correct counts argmax hits; dlogits (optional) = (softmax - q) *
// grad_scale, q = (1-e) onehot + e/K.
double softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float* dlogits, int64_t* correct,
                    float label_smoothing = 0.f);

}  // namespace dpt::cpu
