// Entry points of ops.h's hand-written loops (ReLU, residual add, pooling, BatchNorm, flatten,
// column sums, im2col/col2im, SGD, sum of squares, softmax cross-entropy): the loops themselves are
// in ops_loops.inc, compiled for each level of isa.h, and each call runs the copy of the level
// isa.cc chose (one table lookup per call, not per element).
#include "cpu/ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/isa.h"

namespace dpt::cpu {

namespace {

// One level's copies of the loops; the types are ops.h's own declarations.
struct Loops {
  decltype(&cpu::relu_forward) relu_forward;
  decltype(&cpu::relu_backward) relu_backward;
  decltype(&cpu::add) add;
  decltype(&cpu::add_inplace) add_inplace;
  decltype(&cpu::avgpool_forward) avgpool_forward;
  decltype(&cpu::avgpool_backward) avgpool_backward;
  decltype(&cpu::relu_avgpool_forward) relu_avgpool_forward;
  decltype(&cpu::relu_avgpool_backward) relu_avgpool_backward;
  decltype(&cpu::global_avgpool_forward) global_avgpool_forward;
  decltype(&cpu::global_avgpool_backward) global_avgpool_backward;
  decltype(&cpu::bn_sums) bn_sums;
  decltype(&cpu::bn_apply) bn_apply;
  decltype(&cpu::bn_backward_sums) bn_backward_sums;
  decltype(&cpu::bn_backward_apply) bn_backward_apply;
  decltype(&cpu::column_sums) column_sums;
  decltype(&cpu::im2col_nhwc) im2col_nhwc;
  decltype(&cpu::col2im_nhwc) col2im_nhwc;
  decltype(&cpu::nhwc_to_chw) nhwc_to_chw;
  decltype(&cpu::chw_to_nhwc) chw_to_nhwc;
  decltype(&cpu::sgd_update) sgd_update;
  decltype(&cpu::sum_squares) sum_squares;
  decltype(&cpu::softmax_xent) softmax_xent;
};

#define DPT_ISA_LOOPS "cpu/ops_loops.inc"
#include "cpu/isa_targets.inc"
#undef DPT_ISA_LOOPS

const Loops kByIsa[] = {isa_generic::kLoops, isa_avx2::kLoops, isa_avx512::kLoops};
const Loops& loops() { return for_active_isa(kByIsa); }

}  // namespace

void relu_forward(const float* x, float* y, int64_t n) { loops().relu_forward(x, y, n); }
void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
  loops().relu_backward(y, dy, dx, n);
}
void add(const float* a, const float* b, float* y, int64_t n) { loops().add(a, b, y, n); }
void add_inplace(float* y, const float* b, int64_t n) { loops().add_inplace(y, b, n); }

void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                     int s) {
  loops().avgpool_forward(x, y, n, h, w, c, k, s);
}
void avgpool_backward(const float* dy, float* dx, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                      int s) {
  loops().avgpool_backward(dy, dx, n, h, w, c, k, s);
}
void relu_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                          int k, int s) {
  loops().relu_avgpool_forward(x, y, n, h, w, c, k, s);
}
void relu_avgpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h,
                           int64_t w, int64_t c, int k, int s) {
  loops().relu_avgpool_backward(x, dy, dx, n, h, w, c, k, s);
}
void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  loops().global_avgpool_forward(x, y, n, hw, c);
}
void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c) {
  loops().global_avgpool_backward(dy, dx, n, hw, c);
}

void bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq) {
  loops().bn_sums(x, m, c, sum, sumsq);
}
void bn_apply(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
              const float* beta, int64_t m, int64_t c, const float* residual, bool relu) {
  loops().bn_apply(x, y, mean, invstd, gamma, beta, m, c, residual, relu);
}
void bn_backward_sums(const float* x, const float* dy, const float* relu_out, const float* mean,
                      const float* invstd, int64_t m, int64_t c, double* sum_dy,
                      double* sum_dy_xhat, float* dz) {
  loops().bn_backward_sums(x, dy, relu_out, mean, invstd, m, c, sum_dy, sum_dy_xhat, dz);
}
void bn_backward_apply(const float* x, const float* dy, const float* relu_out, const float* mean,
                       const float* invstd, const float* gamma, const double* sum_dy,
                       const double* sum_dy_xhat, double count, int64_t m, int64_t c, float* dx) {
  loops().bn_backward_apply(x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c,
                            dx);
}

void column_sums(const float* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  loops().column_sums(a, rows, cols, out, accumulate);
}
void im2col_nhwc(const float* x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* col) {
  loops().im2col_nhwc(x, n, h, w, c, k, stride, pad, col);
}
void col2im_nhwc(const float* dcol, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                 int64_t stride, int64_t pad, float* dx) {
  loops().col2im_nhwc(dcol, n, h, w, c, k, stride, pad, dx);
}
void nhwc_to_chw(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c) {
  loops().nhwc_to_chw(x, y, n, h, w, c);
}
void chw_to_nhwc(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c) {
  loops().chw_to_nhwc(x, y, n, h, w, c);
}

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay, bool first, float coef) {
  loops().sgd_update(p, g, buf, n, lr, momentum, weight_decay, first, coef);
}
double sum_squares(const float* x, int64_t n) { return loops().sum_squares(x, n); }
double softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float* dlogits, int64_t* correct) {
  return loops().softmax_xent(logits, labels, n, k, grad_scale, dlogits, correct);
}

}  // namespace dpt::cpu
