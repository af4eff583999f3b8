// Element storage of the templated kernels: fp32, or a 16-bit type (__nv_bfloat16, __half) that the
// launchers receive as uint16_t bit patterns (precision.cuh: no CUDA half type crosses a host
// header) and reinterpret. Loads widen exactly and stores round to nearest even (a NaN becomes the
// type's canonical NaN), so a kernel instantiated on bf16 computes in float exactly as its fp32
// form and rounds once per stored value: the CPU's widen -> float op -> round
// (include/dpt/backend.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dpt::cuda {

// The exact widening.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }

// y = v in y's type, rounded to nearest even.
__device__ __forceinline__ void store(float v, float& y) { y = v; }
__device__ __forceinline__ void store(float v, __nv_bfloat16& y) { y = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float v, __half& y) { y = __float2half_rn(v); }

// A launcher's bf16 bit patterns as the kernels' element type (the same two bytes).
inline const __nv_bfloat16* as_bf16(const uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
inline __nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace dpt::cuda
