// What the CPU kernels' hot loops share (internal to kernels/cpu):
//   - ZR_CPU_CLONES: GCC function multiversioning. A function so marked is compiled for AVX-512
//     (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline, and the loader picks the best for the
//     machine it runs on (an ifunc), so one portable binary uses the machine's vector width
//     (`zerort env`: "CPU loops"). -DZR_CPU_DISPATCH=OFF builds the baseline only. Nothing is
//     contracted into an FMA (CMakeLists.txt), so an element-wise loop gives the same bits in
//     every version; a loop with `omp simd reduction` sums in as many partial sums as the width
//     holds, so its last bits follow the width (docs/cpu-performance.md). tools/cpu_levels.py
//     runs the tests with the other versions, on emulated CPUs.
//   - FastExp: e^x for float without a libm call (kernels/model_math.h, shared with the CUDA
//     kernels), so that loops calling it vectorise (std::exp and std::tanh are scalar calls into
//     libm: the GELU's tanh was 20% of a tiny model's step).
//   - ParallelFor: contiguous pieces of a range over the OpenMP threads (OpenBLAS's OpenMP build
//     shares the pool). Each element or row is computed by the same code whichever piece it
//     falls in, so the result does not depend on the thread count; reductions across rows use
//     fixed blocks (kRowBlock) summed in order, for the same reason.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "zerort/kernels/model_math.h"

#if defined(ZR_CPU_DISPATCH) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZR_CPU_CLONES_BUILT 1
#define ZR_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZR_CPU_CLONES_BUILT 0
#define ZR_CPU_CLONES
#endif

namespace zerort::cpu {

// e^x without a libm call: kernels/model_math.h's, shared with the CUDA kernels.
using math::FastExp;

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
