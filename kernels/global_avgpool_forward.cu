// Global average pooling forward (NHWC): one thread per (image, channel), reads coalesced in c.
#include "global_avgpool_forward.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void gap_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                          int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * c) {
    const int64_t b = i / c, ch = i % c;
    float acc = 0.f;
    for (int64_t p = 0; p < hw; ++p) acc += x[(b * hw + p) * c + ch];
    y[i] = acc * inv;
  }
}

cudaError_t launch_global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c,
                                          cudaStream_t stream) {
  if (n * c <= 0) return cudaSuccess;
  gap_forward_kernel<<<blocks_for(n * c), kThreads, 0, stream>>>(x, y, n, hw, c);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
