// The SGD update kernel of kernels/sgd_update.cuh: one grid-stride pass over the flat buffers.
#include "sgd_update.cuh"

namespace dpt::cuda {

static __global__ void sgd_update_kernel(float* __restrict__ p, const float* __restrict__ g,
                                         float* __restrict__ buf, int64_t n, float lr,
                                         float momentum, float wd, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
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

cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, float lr,
                              float momentum, float weight_decay, bool first, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 4096 ? want : 4096);
  sgd_update_kernel<<<blocks, threads, 0, stream>>>(p, g, buf, n, lr, momentum, weight_decay, first);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
