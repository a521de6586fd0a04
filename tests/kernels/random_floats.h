// Fresh random inputs for the kernel twins: normal values spread over 40 binades, plus the edge
// cases that rounding code gets wrong (f16 overflow boundary, negative zero, half the smallest
// f16 subnormal).
#pragma once

#include <cmath>
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
