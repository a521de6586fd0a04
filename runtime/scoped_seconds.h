// ScopedSeconds: adds the wall seconds of its lifetime to a counter (phase timings: the optimizer's
// host time, the model's forward and backward, wall_clock_breakdown).
#pragma once

#include <chrono>

namespace zerort {

class ScopedSeconds {
 public:
  // `into` may be null (nothing is counted).
  explicit ScopedSeconds(double* into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedSeconds() {
    if (into_ != nullptr) {
      *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }
  }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double* into_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace zerort
