// What the CPU kernels' hot loops share (internal to kernels/cpu):
//   - ZR_CPU_CLONES: GCC function multiversioning. A function so marked is compiled for AVX-512
//     (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline, and the loader picks the best for the
//     machine it runs on (an ifunc), so one portable binary uses the machine's vector width.
//     -DZR_CPU_DISPATCH=OFF builds the baseline only.
//   - FastExp: e^x for float without a libm call, so that loops calling it vectorise (std::exp
//     and std::tanh are scalar calls into libm: the GELU's tanh was 20% of a tiny model's step).
//   - ParallelFor: contiguous pieces of a range over the OpenMP threads (OpenBLAS's OpenMP build
//     shares the pool). Each element or row is computed by the same code whichever piece it
//     falls in, so the result does not depend on the thread count; reductions across rows use
//     fixed blocks (kRowBlock) summed in order, for the same reason.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(ZR_CPU_DISPATCH) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZR_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZR_CPU_CLONES
#endif

namespace zerort::cpu {

// e^x, relative error below 3e-7 (Cephes' expf polynomial after a Cody-Waite reduction);
// arguments below -87.3 give about 1e-38 instead of smaller values or 0, above 88.37 they give
// e^88.37; NaN stays NaN. Branch-free and inline, so loops calling it vectorise.
inline float FastExp(float x) {
  x = std::min(std::max(x, -87.3365447f), 88.3762626f);
  // n = round(x / ln 2), by the 1.5 x 2^23 trick (exact for |n| < 2^22; no SSE4.1 needed).
  const float shifted = x * 1.44269504089f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from n's bits in `shifted` (its low mantissa bits hold n + 2^22): unsigned arithmetic,
  // no float-to-int conversion, so a NaN argument is not undefined behaviour (p is NaN anyway).
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Rows per block of a cross-row reduction (a bias or LayerNorm weight gradient): each block's
// partial sums are computed by one thread and the blocks added in order.
inline constexpr int64_t kRowBlock = 32;

// f(begin, end) over [0, n) in at most one piece per OpenMP thread, each at least `grain`
// elements; serial inside an enclosing parallel region or when the range is small.
template <typename F>
void ParallelFor(int64_t n, int64_t grain, F&& f) {
  const int64_t pieces = std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(grain, 1));
  if (pieces <= 1 || omp_in_parallel()) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for schedule(static, 1) num_threads(static_cast <int>(pieces))
  for (int64_t p = 0; p < pieces; ++p) f(n * p / pieces, n * (p + 1) / pieces);
}

}  // namespace zerort::cpu
