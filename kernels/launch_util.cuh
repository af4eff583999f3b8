// Grid sizing shared by the element-wise launchers: 256 threads, at most 65535 blocks with a
// grid-stride loop (index arithmetic in int64 for large tensors).
#pragma once

#include <cstdint>

namespace dpt::cuda {
constexpr int kThreads = 256;
inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
#define DPT_GRID_STRIDE(i, n)                                                                  \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n);     \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
}  // namespace dpt::cuda
