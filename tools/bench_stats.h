// Statistics the bench subcommands report.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace zerort::cli {

// The median of repeated timings (the mean of the middle two for an even count; 0 for none).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// One call's wall-clock seconds.
inline double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zerort::cli
