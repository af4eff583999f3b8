// Optimizer kernels and their launchers (see optimizer.cuh): the SGD update and the one-thread
// scalar store that feeds it the learning rate.
#include "launch_util.cuh"
#include "optimizer.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// The SGD update kernel: one grid-stride pass over the flat buffers.

static __global__ void sgd_update_kernel(float* __restrict__ p, const float* __restrict__ g,
                                         float* __restrict__ buf, int64_t n, const float* __restrict__ lr_at,
                                         float momentum, float wd, bool first) {
  const float lr = *lr_at;
  DPT_GRID_STRIDE(i, n) {
    const float d = g[i] + wd * p[i];
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
                              float momentum, float weight_decay, bool first, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sgd_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, g, buf, n, lr, momentum, weight_decay, first);
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
