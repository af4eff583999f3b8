// 16-bit floating-point storage on the host: bfloat16 and IEEE half as uint16_t bit patterns, with
// round-to-nearest-even conversions from float, for gradients sent compressed (--grad-dtype). The
// arithmetic stays in float: a 16-bit value is only ever stored or sent.
#pragma once

#include <cstdint>
#include <cstring>

#include "dpt/dtype.h"

namespace dpt {

// A bfloat16 value in memory (16-bit activations, --activation-dtype bf16): its bit pattern, as a
// type of its own so that the operations' 16-bit overloads (backend.h) are chosen by their pointers
// and a tensor's element type is checked (tensor.h).
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(BFloat16) == 2, "BFloat16 is two bytes");
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBF16;
}

// bfloat16: float's top 16 bits, rounded to nearest even; NaN stays NaN (quietened), infinities
// and overflow become infinities, as in torch.
inline uint16_t bf16_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float float_from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 through the compiler's _Float16 (x86-64 g++ >= 12: F16C where the CPU has it,
// else software), which rounds to nearest even and overflows to infinity.
inline uint16_t f16_from_float(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float float_from_f16(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// n floats to 16-bit values of type dt (kBF16 or kF16), and back.
inline void compress16(const float* in, uint16_t* out, int64_t n, DType dt) {
  if (dt == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_from_float(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = f16_from_float(in[i]);
}
inline void decompress16(const uint16_t* in, float* out, int64_t n, DType dt) {
  if (dt == DType::kBF16)
    for (int64_t i = 0; i < n; ++i) out[i] = float_from_bf16(in[i]);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = float_from_f16(in[i]);
}

}  // namespace dpt
