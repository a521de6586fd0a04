// Element types and the exact conversions between fp32 and the 16-bit float formats.
// bf16 and f16 are stored as raw bits (BFloat16, Half); conversions to them round to nearest
// even, keep the sign of zero, saturate to infinity past the largest finite value and turn any
// NaN into a quiet NaN of the same sign. Conversions to fp32 are exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "runtime/status.h"

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

inline uint16_t FloatToBf16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t lsb = (bits >> 16) & 1u;
  // Round to nearest even; the carry runs into the exponent (and to inf) correctly.
  const uint32_t rounded = (bits + 0x7fffu + lsb) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  // A select, not a branch, so loops that convert vectorise.
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float Bf16BitsToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t FloatToF16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf stays inf; NaN becomes quiet NaN keeping the top payload bits
    return static_cast<uint16_t>(sign |
                                 (abs > 0x7f800000u ? 0x7e00u | ((abs >> 13) & 0x3ffu) : 0x7c00u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                // below 2^-14: f16 subnormal or zero
    if (abs <= 0x33000000u) return sign;  // <= 2^-25, half of the smallest subnormal: ties to 0
    const uint32_t exponent = abs >> 23;
    const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // value = significand * 2^(exponent-150), unit 2^-24
    uint32_t result = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (abs >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float F16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

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
