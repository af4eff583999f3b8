// ReLU backward kernel and its launcher.
#include "launch_util.cuh"
#include "relu_backward.cuh"

namespace dpt::cuda {

static __global__ void relu_backward_kernel(const float* __restrict__ y, const float* __restrict__ dy,
                                            float* __restrict__ dx, int64_t n) {
  DPT_GRID_STRIDE(i, n) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
