// DType: the element types the rest of the code names at run time (collectives, tensors, the
// compressed gradient wire, --activation-dtype), and dtype_of<T>, the DType of a C++ type. A basic
// type with no dependencies, at the bottom of the include graph.
#pragma once

#include <cstdint>
#include <type_traits>

namespace dpt {

// kBF16 and kF16 are 16-bit floats stored as uint16_t (see half.h); only kSum reduces them, adding
// in float and rounding each partial sum (gradients sent compressed, --grad-dtype).
enum class DType { kF32, kF64, kI32, kI64, kU64, kU8, kBF16, kF16 };

// The DType of T; half.h adds BFloat16's. A type without one does not compile.
template <typename T>
inline constexpr bool kHasNoDType = false;
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return DType::kU64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::kU8;
  else
    static_assert(kHasNoDType<T>, "no DType for this type");
}

}  // namespace dpt
