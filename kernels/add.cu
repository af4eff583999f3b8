// Residual add (optionally fused with ReLU) kernel and its launcher.
#include "add.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ y, int64_t n, bool relu) {
  DPT_GRID_STRIDE(i, n) {
    const float v = a[i] + b[i];
    y[i] = relu && v < 0.f ? 0.f : v;
  }
}

cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n, relu);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
