// Rounded float arithmetic for the math the CPU and CUDA kernels share (optimizer_math.h,
// model_math.h): each product, sum, difference, quotient and square root rounded on its own,
// never fused into an FMA. The CPU build does not contract (-ffp-contract=off for all C++,
// CMakeLists.txt: GCC contracts by default even in ISO C++ mode, in the AVX2/AVX-512 clones of
// the CPU kernels too), and on the GPU each operation is an explicitly rounded intrinsic
// (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never fuses. So a
// function written with these gives the same bits on both devices.
#pragma once

#include <cmath>

#include "zerort/runtime/float_bits.h"  // ZR_HOST_DEVICE

namespace zerort::math {

ZR_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

ZR_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

ZR_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

ZR_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

ZR_HOST_DEVICE inline float Sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// a x b + c rounded once (IEEE fused multiply-add): the same bits on both devices, where a
// caller wants the fusion (flash attention's exponent, kernels/flash_forward.h).
ZR_HOST_DEVICE inline float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// std::max(a, b) and std::min(a, b) exactly (a NaN in `a` is kept), on both devices; fmaxf and
// fminf would drop the NaN.
ZR_HOST_DEVICE inline float Max(float a, float b) { return a < b ? b : a; }
ZR_HOST_DEVICE inline float Min(float a, float b) { return b < a ? b : a; }
// The larger of a and b ignoring a NaN (IEEE maxNum: fmaxf, std::fmax): one FMNMX instruction
// on the GPU, where Max's NaN-keeping compare and select take two. Where `a` is never a NaN (the
// flash forward's row maxima start at -inf) the two agree but for which zero a tie of -0 and +0
// gives, which changes no probability (kernels/flash_forward.h).
ZR_HOST_DEVICE inline float MaxNum(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(a, b);
#else
  return std::fmax(a, b);
#endif
}

// The same in double, for the few shared functions that need more than float's precision on
// the way to a float result (the rotary embeddings' cosine and sine, model_math.h): each
// operation rounded on its own (__dmul_rn, __dadd_rn on the GPU), so both devices give
// the same bits.
ZR_HOST_DEVICE inline double MulD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

ZR_HOST_DEVICE inline double AddD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// The largest integer not above a (exact on both devices).
ZR_HOST_DEVICE inline double FloorD(double a) {
#if defined(__CUDA_ARCH__)
  return floor(a);
#else
  return std::floor(a);
#endif
}

// a rounded to the nearest integer, ties to even (exact on both devices).
ZR_HOST_DEVICE inline double RintD(double a) {
#if defined(__CUDA_ARCH__)
  return rint(a);
#else
  return std::nearbyint(a);
#endif
}

// Whether v is neither infinite nor NaN, from its exponent bits (the loss scaler's overflow
// check on both devices: no dependence on how a compiler treats std::isfinite).
ZR_HOST_DEVICE inline bool IsFinite(float v) { return (FloatBits(v) & 0x7f800000u) != 0x7f800000u; }

}  // namespace zerort::math
