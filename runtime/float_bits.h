// The bit-level conversions between fp32 and the 16-bit float formats, one definition for the
// host and the CUDA kernels (ZR_HOST_DEVICE: kernels/cuda/convert.cuh calls them instead of the
// CUDA intrinsics), so both devices round the same way, NaN payloads included: bf16 and f16 are
// stored as raw bits; conversions to them round to nearest even, keep the sign of zero, saturate
// to infinity past the largest finite value and turn any NaN into a quiet NaN of the same sign
// that keeps the payload's top bits (the intrinsics give one canonical NaN instead). Conversions
// to fp32 are exact. tests/runtime/dtype_test.cc checks every bf16 and f16 value.
#pragma once

#include <bit>
#include <cstdint>

// A function both the host compiler and nvcc's device pass compile.
#if defined(__CUDACC__)
#define ZR_HOST_DEVICE __host__ __device__
#else
#define ZR_HOST_DEVICE
#endif

namespace zerort {

ZR_HOST_DEVICE inline uint32_t FloatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return std::bit_cast<uint32_t>(value);
#endif
}

ZR_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

ZR_HOST_DEVICE inline uint16_t FloatToBf16Bits(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t lsb = (bits >> 16) & 1u;
  // Round to nearest even; the carry runs into the exponent (and to inf) correctly.
  const uint32_t rounded = (bits + 0x7fffu + lsb) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  // A select, not a branch, so loops that convert vectorise.
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

ZR_HOST_DEVICE inline float Bf16BitsToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

ZR_HOST_DEVICE inline uint16_t FloatToF16Bits(float value) {
  const uint32_t bits = FloatBits(value);
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

ZR_HOST_DEVICE inline float F16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(magnitude) | sign);
  }
  if (exponent == 0x1fu) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace zerort
