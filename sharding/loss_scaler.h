// Dynamic loss scaling for fp16, with DeepSpeed's semantics (DynamicLossScaler): the scale
// halves after `hysteresis` overflows (never below min_loss_scale) and doubles after
// `loss_scale_window` overflow-free steps. Every rank feeds it the all-reduced overflow flag,
// so every rank holds the same scale. A long run of skipped steps is an error.
#pragma once

#include <cstdint>

#include "zerort/runtime/status.h"
#include "zerort/sharding/options.h"

namespace zerort {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options, bool enabled);

  float scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  // Records a step's outcome. Fails once max_consecutive_skips steps in a row overflowed.
  Status Update(bool overflow);

  // Everything Update reads and writes, for checkpoints: a restored scaler continues exactly.
  struct State {
    float scale = 1.0f;
    int hysteresis_left = 0;
    int64_t iteration = 0;
    int64_t last_overflow_iteration = -1;
    int64_t skipped = 0;
    int consecutive_skips = 0;
  };
  State state() const {
    return {scale_,   hysteresis_left_,  iteration_, last_overflow_iteration_,
            skipped_, consecutive_skips_};
  }
  void Restore(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    iteration_ = s.iteration;
    last_overflow_iteration_ = s.last_overflow_iteration;
    skipped_ = s.skipped;
    consecutive_skips_ = s.consecutive_skips;
  }

 private:
  LossScaleOptions options_;
  bool enabled_;
  float scale_;
  int hysteresis_left_;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
  int64_t skipped_ = 0;
  int consecutive_skips_ = 0;
};

}  // namespace zerort
