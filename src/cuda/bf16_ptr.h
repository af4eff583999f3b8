// dpt::BFloat16 pointers (the 16-bit activation overloads of include/dpt/backend.h) as the GPU code
// takes them: uint16_t bit patterns for the kernels/ launchers (precision.cuh's convention) and
// __nv_bfloat16 for the cuDNN and cuBLAS wrappers. All three are the same two bytes, so each is a
// cast; null stays null. Host code only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "dpt/half.h"

namespace dpt::gpu {

static_assert(sizeof(__nv_bfloat16) == sizeof(BFloat16) &&
                  alignof(__nv_bfloat16) == alignof(BFloat16),
              "BFloat16 and __nv_bfloat16 must share a layout");

inline const uint16_t* bits(const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits(BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }
inline const __nv_bfloat16* nv(const BFloat16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
inline __nv_bfloat16* nv(BFloat16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace dpt::gpu
