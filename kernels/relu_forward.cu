// ReLU forward kernel and its launcher.
#include "launch_util.cuh"
#include "relu_forward.cuh"

namespace dpt::cuda {

static __global__ void relu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
