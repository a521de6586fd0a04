// Element types and the conversions between fp32 and the 16-bit float formats (the bit-level
// conversions are runtime/float_bits.h's, shared with the CUDA kernels).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "zerort/runtime/float_bits.h"
#include "zerort/runtime/status.h"

namespace zerort {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kI32,  // integer types are for collectives on counters, flags and token ids
  kI64,
  kU8,
};

size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "f32", "bf16", ...
bool IsFloatingPoint(DType dtype);
// Accepts the names zerort prints and the usual aliases: fp32/float32/float, bf16/bfloat16,
// fp16/f16/float16/half, i32/int32, i64/int64, u8/uint8.
StatusOr<DType> ParseDType(std::string_view name);

// Element i of a floating-point buffer of `dtype`, as fp32 (exact), and the rounded store.
inline float LoadAsFloat(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline void StoreFromFloat(void* base, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(value);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16Bits(value);
      return;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

// Storage types for the 16-bit formats: raw bits with explicit conversions.
struct BFloat16 {
  uint16_t bits = 0;
  static BFloat16 FromFloat(float value) { return BFloat16{FloatToBf16Bits(value)}; }
  float ToFloat() const { return Bf16BitsToFloat(bits); }
};

struct Half {
  uint16_t bits = 0;
  static Half FromFloat(float value) { return Half{FloatToF16Bits(value)}; }
  float ToFloat() const { return F16BitsToFloat(bits); }
};

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};

// T's DType, or nullopt for an element type no DType names (double: the finite-difference
// kernels and their weight store, which no collective carries).
template <typename T>
constexpr std::optional<DType> DTypeIfAny() {
  if constexpr (requires { DTypeOf<T>::value; }) {
    return DTypeOf<T>::value;
  } else {
    return std::nullopt;
  }
}

}  // namespace zerort
