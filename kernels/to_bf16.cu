// The fp32 -> bf16 kernel of to_bf16.cuh and its launcher.
#include <cuda_bf16.h>

#include "launch_util.cuh"
#include "to_bf16.cuh"

namespace dpt::cuda {

static __global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
