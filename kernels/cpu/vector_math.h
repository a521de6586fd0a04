// What the CPU kernels' hot loops share (internal to kernels/cpu):
//   - ZR_CPU_CLONES: GCC function multiversioning. A function so marked is compiled for AVX-512
//     (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline, and the loader picks the best for the
//     machine it runs on (an ifunc), so one portable binary uses the machine's vector width
//     (`zerort env`: "CPU loops"). -DZR_CPU_DISPATCH=OFF builds the baseline only. Nothing is
//     contracted into an FMA (CMakeLists.txt), so an element-wise loop gives the same bits in
//     every version, and the sums along a row are written out in lanes (RowSum below) so that
//     theirs do too (docs/cpu-performance.md). tools/cpu_levels.py runs the tests with the
//     other versions, on emulated CPUs; tools/cpu_clones.py reads the built library and fails
//     where a loop that the AVX-512 version vectorises runs scalar in another (GCC's default
//     -ftrapping-math did that to every loop with a float select below AVX-512: the library is
//     built without it, kernels/CMakeLists.txt).
//   - FastExp: e^x for float without a libm call (kernels/model_math.h, shared with the CUDA
//     kernels), so that loops calling it vectorise (std::exp and std::tanh are scalar calls into
//     libm: the GELU's tanh was 20% of a tiny model's step).
//   - Lanes, RowSum: sums in written-out partial sums, the same in every version.
//   - ParallelFor: contiguous pieces of a range over the OpenMP threads (OpenBLAS's OpenMP build
//     shares the pool). Each element or row is computed by the same code whichever piece it
//     falls in, so the result does not depend on the thread count; reductions across rows use
//     fixed blocks (kRowBlock) summed in order, for the same reason.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerort/kernels/model_math.h"
#include "zerort/runtime/dtype.h"

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

// out[i] = value as Out (float, BFloat16 or Half; nothing for void), rounded to nearest even: a
// compute copy's store in a vectorised update loop (the optimizers' host updates), inlined into
// each ZR_CPU_CLONES version.
template <typename Out>
[[gnu::always_inline]] inline void StoreAs(Out* out, int64_t i, float value) {
  if constexpr (std::is_same_v<Out, float>) {
    out[i] = value;
  } else if constexpr (std::is_same_v<Out, BFloat16>) {
    out[i].bits = FloatToBf16Bits(value);
  } else if constexpr (std::is_same_v<Out, Half>) {
    out[i].bits = FloatToF16Bits(value);
  }
}

// [Note: sums in written-out lanes]
// A loop with `omp simd reduction` lets the vectoriser keep as many partial sums as the vector
// holds (16 floats with AVX-512, 8 with AVX2, 4 with SSE) and add them in an order of its own,
// so the sum's last bits follow the ZR_CPU_CLONES version the machine runs, and with them a
// whole run's (a tiny GPT's grad norm moved by 5e-8 between AVX-512 and AVX2 machines). The sums
// here are written out: element i of a row into lane i % kN, the tail into the first lanes, the
// lanes then added in a fixed tree (Lanes::Total). Every version computes the same sums in the
// same order, and the vectoriser still keeps the lanes in registers (one zmm, two ymm or four
// xmm for 16 floats): a LayerNorm's row sums over 768 channels ran as fast as the reduction's,
// and faster at the baseline (a scratch program with the build's flags, 2026-12-06). Sums whose
// terms are cheap and many (the norm's sum of squares, kernels/cpu/reduce.cc; LAMB's norms) use
// eight double lanes; a row's sums (LayerNorm, RMSNorm, the softmax and flash blocks'
// normalisers, attention's D) sixteen float lanes. fast_ops_test compares them bitwise with a
// plain scalar loop in the same order, natively and on the emulated CPUs.
template <typename T, int kN>
struct Lanes {
  T lane[kN] = {};
  // The lanes' sum: lane j += lane j + w for w = kN / 2, ..., 1.
  T Total() {
    for (int w = kN / 2; w >= 1; w /= 2) {
      for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
    }
    return lane[0];
  }
};

// body(i, j) for each i in [0, n) in order, j = i % kN: element i's lane.
template <int kN, typename F>
[[gnu::always_inline]] inline void ForLanes(int64_t n, F&& body) {
  int64_t i = 0;
  for (; i + kN <= n; i += kN) {
    for (int j = 0; j < kN; ++j) body(i + j, j);
  }
  for (int j = 0; i + j < n; ++j) body(i + j, j);
}

inline constexpr int kRowLanes = 16;

// The sum of term(c) over c in [0, n), in kRowLanes lanes ([Note: sums in written-out lanes]).
template <typename F>
[[gnu::always_inline]] inline float RowSum(int n, F&& term) {
  Lanes<float, kRowLanes> s;
  ForLanes<kRowLanes>(n, [&](int64_t c, int j) { s.lane[j] += term(static_cast<int>(c)); });
  return s.Total();
}

// Two sums over the same elements in one pass: term(c) returns element c's two terms.
template <typename F>
[[gnu::always_inline]] inline std::pair<float, float> RowSums(int n, F&& term) {
  Lanes<float, kRowLanes> a, b;
  ForLanes<kRowLanes>(n, [&](int64_t c, int j) {
    const std::pair<float, float> t = term(static_cast<int>(c));
    a.lane[j] += t.first;
    b.lane[j] += t.second;
  });
  return {a.Total(), b.Total()};
}

// f(begin, end) for the fixed chunks [k chunk, (k + 1) chunk) of [0, n) on the OpenMP threads,
// the results in chunk order: a sum of them depends neither on the thread count nor on timing
// (an OpenMP `reduction` clause adds the threads' partial sums in the order they finish).
template <typename F>
auto ChunkResults(int64_t n, int64_t chunk, F&& f) {
  using Result = decltype(f(int64_t{0}, int64_t{0}));
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<Result> results(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t k = 0; k < chunks; ++k) {
    results[static_cast<size_t>(k)] = f(k * chunk, std::min(n, (k + 1) * chunk));
  }
  return results;
}

// Rows per block of a cross-row reduction (a bias or LayerNorm weight gradient): each block's
// partial sums are computed by one thread and the blocks added in order.
inline constexpr int64_t kRowBlock = 32;

// Elements per OpenMP thread, at least, in the row and element-wise loops (ParallelFor's grain):
// rows per thread so that each gets that many elements of rows `cols` wide, and the same in
// blocks of kRowBlock rows.
inline constexpr int64_t kElementGrain = int64_t{1} << 14;
inline int64_t RowGrain(int cols) {
  return std::max<int64_t>(1, kElementGrain / std::max(cols, 1));
}
inline int64_t RowBlockGrain(int cols) { return std::max<int64_t>(1, RowGrain(cols) / kRowBlock); }

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
