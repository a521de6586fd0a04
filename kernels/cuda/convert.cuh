// Device-side conversions between fp32 and the element types of the CUDA kernels (float,
// __nv_bfloat16, __half): runtime/float_bits.h's bit conversions, the host's own code, so a
// rounding or a NaN payload is the same bits on both devices (the cvt intrinsics would give one
// canonical NaN).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "zerort/runtime/float_bits.h"

namespace zerort::cuda {

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return Bf16BitsToFloat(__nv_bfloat16_raw(v).x);
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return F16BitsToFloat(__half_raw(v).x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  __nv_bfloat16_raw raw;
  raw.x = FloatToBf16Bits(v);
  return __nv_bfloat16(raw);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  __half_raw raw;
  raw.x = FloatToF16Bits(v);
  return __half(raw);
}

}  // namespace zerort::cuda
