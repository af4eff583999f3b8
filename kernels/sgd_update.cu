// The SGD update kernel of kernels/sgd_update.cuh: one grid-stride pass over the flat buffers.
#include "launch_util.cuh"
#include "sgd_update.cuh"

namespace dpt::cuda {

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

}  // namespace dpt::cuda
