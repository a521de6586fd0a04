// Fresh random inputs for the kernel twins: normal values spread over 40 binades, plus the edge
// cases that rounding code gets wrong (f16 overflow boundary, negative zero, half the smallest
// f16 subnormal).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace zerort::testing {

inline std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 40) - 20));
  v[0] = 65520.0f;
  v[1] = -0.0f;
  v[2] = std::ldexp(1.0f, -25);
  return v;
}

// Infinities and NaNs (quiet, signalling, with payloads) written near both ends of `v` (at
// least 116 elements), inside a vector loop's blocks: the conversions keep a NaN's payload top
// bits on both devices (runtime/float_bits.h), which the CUDA intrinsics would not.
inline void AddSpecialFloats(std::vector<float>& v) {
  const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                               0xffa5a5a5u, 0x7fbfe000u, 0x00000001u, 0x80000000u};
  for (size_t i = 0; i < std::size(specials); ++i) {
    v[100 + i] = std::bit_cast<float>(specials[i]);
    v[v.size() - 1 - i] = std::bit_cast<float>(specials[i]);
  }
}

// Normal values, mean 0, for inputs that must stay in a kernel's ordinary range.
template <typename T = float>
std::vector<T> RandomNormal(size_t n, uint32_t seed, T scale = T(1)) {
  std::mt19937 rng(seed);
  std::normal_distribution<T> d(T(0), scale);
  std::vector<T> v(n);
  for (T& x : v) x = d(rng);
  return v;
}

}  // namespace zerort::testing
