// Optimizer kernels and their launchers (see optimizer.cuh): the SGD update and the one-thread
// scalar store that feeds it the learning rate.
#include <algorithm>

#include "launch_util.cuh"
#include "optimizer.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// The SGD update kernel: one grid-stride pass over the flat buffers.

// The clip coefficient of PyTorch's clip_grad_norm_ (1 when off or within the norm); the caller
// skips the update first when the sum of squares is not finite.
static __device__ float clip_coef(const double* grad_sumsq, float clip_norm) {
  if (!grad_sumsq || clip_norm <= 0.f) return 1.f;
  const double norm = sqrt(*grad_sumsq);
  return norm > clip_norm ? static_cast<float>(clip_norm / (norm + 1e-6)) : 1.f;
}

static __global__ void sgd_update_kernel(float* __restrict__ p, const float* __restrict__ g,
                                         float* __restrict__ buf, int64_t n,
                                         const float* __restrict__ lr_at, float momentum, float wd,
                                         bool first, const double* __restrict__ grad_sumsq,
                                         float clip_norm) {
  if (grad_sumsq && !isfinite(*grad_sumsq))
    return;  // the non-finite guard: this step changes nothing
  const float lr = *lr_at;
  const float c = clip_coef(grad_sumsq, clip_norm);
  DPT_GRID_STRIDE(i, n) {
    const float d = (c == 1.f ? g[i] : c * g[i]) + wd * p[i];
    if (momentum > 0.f) {
      const float b = first ? d : momentum * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * b;
    } else {
      p[i] -= lr * d;
    }
  }
}

cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                              float momentum, float weight_decay, bool first,
                              const double* grad_sumsq, float clip_norm, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sgd_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
      p, g, buf, n, lr, momentum, weight_decay, first, grad_sumsq, clip_norm);
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
