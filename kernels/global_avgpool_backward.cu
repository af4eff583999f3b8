// Global average pooling backward (NHWC): every position of an image gets dy / HW.
#include "global_avgpool_backward.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void gap_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t n,
                                           int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * hw * c) dx[i] = dy[(i / (hw * c)) * c + i % c] * inv;
}

cudaError_t launch_global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c,
                                           cudaStream_t stream) {
  if (n * hw * c <= 0) return cudaSuccess;
  gap_backward_kernel<<<blocks_for(n * hw * c), kThreads, 0, stream>>>(dy, dx, n, hw, c);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
