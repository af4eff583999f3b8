// Grid sizing shared by the element-wise launchers: 256 threads, at most 65535 blocks with a
// grid-stride loop (index arithmetic in int64 for large tensors). Device-side (.cu files only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {
constexpr int kThreads = 256;
inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
#define DPT_GRID_STRIDE(i, n)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// kernel(args...) on a grid sized for n elements (nothing when n <= 0); the launch status. The
// element-wise launchers' one body, so each element type's launcher is one line.
template <class Kernel, class... Args>
cudaError_t launch_over(int64_t n, cudaStream_t stream, Kernel kernel, Args... args) {
  if (n <= 0) return cudaSuccess;
  kernel<<<blocks_for(n), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}
}  // namespace dpt::cuda
