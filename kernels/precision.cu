// The fp32 <-> 16-bit cast kernels and their launchers (see precision.cuh): element-wise
// grid-stride passes over the 16-bit patterns reinterpreted as __nv_bfloat16 or __half, one kernel
// per direction templated on the 16-bit type (storage.cuh's rounding and widening).
#include "launch_util.cuh"
#include "precision.cuh"
#include "storage.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// fp32 -> 16-bit, rounded to nearest even.

template <typename H>
static __global__ void to_16_kernel(const float* __restrict__ x, H* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) store(x[i], y[i]);
}

template <typename H>
static cudaError_t launch_to_16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  to_16_kernel<H><<<blocks_for(n), kThreads, 0, stream>>>(x, reinterpret_cast<H*>(y), n);
  return cudaGetLastError();
}

cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  return launch_to_16<__nv_bfloat16>(x, y, n, stream);
}

cudaError_t launch_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  return launch_to_16<__half>(x, y, n, stream);
}

// ----------------------------------------------------------------------------
// 16-bit -> fp32 (exact), optionally accumulated.

template <typename H>
static __global__ void from_16_kernel(const H* __restrict__ x, float* __restrict__ y, int64_t n,
                                      bool accumulate) {
  DPT_GRID_STRIDE(i, n) {
    const float v = widen(x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}

template <typename H>
static cudaError_t launch_from_16(const uint16_t* x, float* y, int64_t n, bool accumulate,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  from_16_kernel<H>
      <<<blocks_for(n), kThreads, 0, stream>>>(reinterpret_cast<const H*>(x), y, n, accumulate);
  return cudaGetLastError();
}

cudaError_t launch_from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate,
                             cudaStream_t stream) {
  return launch_from_16<__nv_bfloat16>(x, y, n, accumulate, stream);
}

cudaError_t launch_from_f16(const uint16_t* x, float* y, int64_t n, bool accumulate,
                            cudaStream_t stream) {
  return launch_from_16<__half>(x, y, n, accumulate, stream);
}

}  // namespace dpt::cuda
