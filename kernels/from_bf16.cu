// The bf16 -> fp32 kernel of from_bf16.cuh and its launcher.
#include <cuda_bf16.h>

#include "from_bf16.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int64_t n,
                                        bool accumulate) {
  DPT_GRID_STRIDE(i, n) {
    const float v = __bfloat162float(x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}

cudaError_t launch_from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  from_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(x), y, n,
                                                           accumulate);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
