// The fp32 <-> bf16 cast kernels and their launchers (see precision.cuh): element-wise grid-stride
// passes over the 16-bit patterns reinterpreted as __nv_bfloat16.
#include <cuda_bf16.h>

#include "launch_util.cuh"
#include "precision.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// fp32 -> bf16, rounded to nearest even.

static __global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// bf16 -> fp32 (exact), optionally accumulated.

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
