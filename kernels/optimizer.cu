// Optimizer kernels and their launchers (see optimizer.cuh): the SGD and AdamW updates and the
// one-thread scalar store that feeds them the learning rate.
#include <algorithm>

#include "dpt/clip.h"
#include "launch_util.cuh"
#include "optimizer.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// The SGD update kernel: one grid-stride pass over the flat buffers.

// The clip coefficient of PyTorch's clip_grad_norm_ (dpt/clip.h; 1 when off); the caller skips the
// update first when the sum of squares is not finite.
static __device__ float clip_coef(const double* grad_sumsq, float clip_norm) {
  return grad_sumsq ? clip_coefficient(*grad_sumsq, clip_norm) : 1.f;
}

static __global__ void sgd_update_kernel(float* __restrict__ p, const float* __restrict__ g,
                                         float* __restrict__ buf, int64_t n,
                                         const float* __restrict__ lr_at, float momentum, float wd,
                                         bool nesterov, bool first,
                                         const double* __restrict__ grad_sumsq, float clip_norm) {
  if (grad_sumsq && !isfinite(*grad_sumsq))
    return;  // the non-finite guard: this step changes nothing
  const float lr = *lr_at;
  const float c = clip_coef(grad_sumsq, clip_norm);
  DPT_GRID_STRIDE(i, n) {
    const float d = (c == 1.f ? g[i] : c * g[i]) + wd * p[i];
    if (momentum > 0.f) {
      const float b = first ? d : momentum * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + momentum * b : b);
    } else {
      p[i] -= lr * d;
    }
  }
}

cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                              float momentum, float weight_decay, bool nesterov, bool first,
                              const double* grad_sumsq, float clip_norm, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sgd_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      p, g, buf, n, lr, momentum, weight_decay, nesterov, first, grad_sumsq, clip_norm);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// The AdamW update: the step's scalars formed in double by every thread from the learning rate and
// the step count in device memory (so a replayed graph follows both), then one grid-stride pass;
// the count moves on in a one-thread kernel after it.

static __global__ void adamw_update_kernel(float* __restrict__ p, const float* __restrict__ g,
                                           float* __restrict__ m, float* __restrict__ v, int64_t n,
                                           const float* __restrict__ lr_at,
                                           const double* __restrict__ step, double beta1,
                                           double beta2, double eps, double wd,
                                           const double* __restrict__ grad_sumsq, float clip_norm) {
  if (grad_sumsq && !isfinite(*grad_sumsq))
    return;  // the non-finite guard: this step changes nothing
  const double lr = *lr_at, t = *step + 1;
  const float c = clip_coef(grad_sumsq, clip_norm);
  // As the CPU's cpu::adamw_scalars: each scalar in double, rounded to float.
  const float decay = static_cast<float>(1.0 - lr * wd), b1 = static_cast<float>(beta1),
              b1c = static_cast<float>(1.0 - beta1), b2 = static_cast<float>(beta2),
              b2c = static_cast<float>(1.0 - beta2),
              step_size = static_cast<float>(lr / (1.0 - pow(beta1, t))),
              bias2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, t))),
              e = static_cast<float>(eps);
  DPT_GRID_STRIDE(i, n) {
    const float d = c == 1.f ? g[i] : c * g[i];
    const float pi = __fmul_rn(p[i], decay);
    const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(b1c, d));
    const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(b2c, d), d));
    m[i] = mi;
    v[i] = vi;
    p[i] = __fsub_rn(
        pi,
        __fmul_rn(step_size, __fdiv_rn(mi, __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bias2_sqrt), e))));
  }
}

static __global__ void count_step_kernel(double* step, const double* grad_sumsq) {
  if (!grad_sumsq || isfinite(*grad_sumsq)) *step += 1;
}

cudaError_t launch_adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq,
                                int64_t n, const float* lr, double* step, bool count_step,
                                double beta1, double beta2, double eps, double weight_decay,
                                const double* grad_sumsq, float clip_norm, cudaStream_t stream) {
  if (n > 0)
    adamw_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        p, g, exp_avg, exp_avg_sq, n, lr, step, beta1, beta2, eps, weight_decay, grad_sumsq,
        clip_norm);
  if (count_step) count_step_kernel<<<1, 1, 0, stream>>>(step, grad_sumsq);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Sum of squares in two fixed-order passes (no atomics: every run adds in the same order).

constexpr int kSumBlocks = 256;

static __device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

static __global__ void sum_squares_partial_kernel(const float* __restrict__ x, int64_t n,
                                                  double* __restrict__ partials) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  DPT_GRID_STRIDE(i, n) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  const double total = block_sum(acc, s);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

static __global__ void sum_partials_kernel(const double* __restrict__ partials, int count,
                                           double* __restrict__ out) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  const double total = block_sum(acc, s);
  if (threadIdx.x == 0) out[0] = total;
}

int sum_squares_partials() { return kSumBlocks; }

cudaError_t launch_sum_squares(const float* x, int64_t n, double* partials, double* out,
                               cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  const int blocks = n > 0 ? std::min(kSumBlocks, blocks_for(n)) : 1;
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream>>>(x, n, partials);
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, out);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// The one-thread store kernel. A kernel rather than cudaMemcpyAsync from the host: the value
// travels in the launch's parameters, so no host buffer has to outlive the call.

static __global__ void store_scalar_kernel(float* dst, float value) { *dst = value; }

cudaError_t launch_store_scalar(float* dst, float value, cudaStream_t stream) {
  store_scalar_kernel<<<1, 1, 0, stream>>>(dst, value);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
