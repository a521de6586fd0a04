// LossScaler: DeepSpeed's DynamicLossScaler.update_scale, step for step.
#include "zerort/sharding/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zerort/runtime/strings.h"

namespace zerort {

LossScaler::LossScaler(const LossScaleOptions& options, bool enabled)
    : options_(options),
      enabled_(enabled),
      scale_(!enabled          ? 1.0f
             : options.dynamic ? std::ldexp(1.0f, options.initial_scale_power)
                               : options.static_scale),
      hysteresis_left_(options.hysteresis) {}

Status LossScaler::Update(bool overflow) {
  if (overflow) {
    ++skipped_;
    ++consecutive_skips_;
    if (enabled_ && options_.dynamic) {
      if (options_.hysteresis == 1 || hysteresis_left_ == 1) {
        scale_ = std::max(scale_ / 2.0f, options_.min_loss_scale);
      } else {
        --hysteresis_left_;
      }
    }
    last_overflow_iteration_ = iteration_;
    if (consecutive_skips_ >= options_.max_consecutive_skips) {
      return absl::FailedPreconditionError(StrCat(
          consecutive_skips_,
          " consecutive steps had non-finite gradients and were skipped (loss scale ", scale_,
          "); the run cannot make progress: lower the learning rate, check the data, or use bf16"));
    }
  } else {
    consecutive_skips_ = 0;
    if (enabled_ && options_.dynamic &&
        (iteration_ - last_overflow_iteration_) % options_.loss_scale_window == 0) {
      hysteresis_left_ = options_.hysteresis;
      scale_ *= 2.0f;
    }
  }
  ++iteration_;
  return absl::OkStatus();
}

}  // namespace zerort
