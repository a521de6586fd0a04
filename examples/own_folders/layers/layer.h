// The trainer's own layer: y = W x over a unit's gathered weight.
#pragma once
#if __INCLUDE_LEVEL__ != 1
#error "the trainer's own layers/layer.h was included by another header (zerort's?)"
#endif
#include <cstdint>

namespace own {

inline float Dot(const float* w, const float* x, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += w[i] * x[i];
  return s;
}

}  // namespace own
