// ZeroOneSchedule (zero_one_schedule.h): DeepSpeed's zoadam.py counters, step by step.
#include "sharding/zero_one_schedule.h"

#include <algorithm>

namespace zerort {

ZeroOneStep ZeroOneSchedule::Next() const {
  const int64_t t = t_ + 1;
  ZeroOneStep s;
  s.init = t == 1;
  s.frozen = frozen_;
  s.reduce = s.init || (!frozen_ && reduce_next_);
  s.variance = !s.init && !frozen_ && t % var_interval_ == 0;
  s.reset_errors = frozen_ && !errors_reset_;
  s.sync = frozen_ && t % local_interval_ == 0;
  return s;
}

void ZeroOneSchedule::Advance() {
  const int64_t t = ++t_;
  if (t == 1) return;  // the initialisation step returns before any counter moves
  if (!frozen_) {
    if (t % var_interval_ == 0 && ++var_counter_ == o_.var_update_scaler) {
      var_counter_ = 0;
      var_interval_ *= 2;
    }
    reduce_next_ = (t + 1) % var_interval_ == 0;
  } else {
    errors_reset_ = true;
    if (++local_counter_ == o_.local_step_scaler) {
      local_counter_ = 0;
      local_interval_ = std::min<int64_t>(o_.local_step_clipper, local_interval_ * 2);
    }
  }
  if (t > o_.var_freeze_step) frozen_ = true;
}

void ZeroOneSchedule::Restore(int64_t steps) {
  *this = ZeroOneSchedule(o_);
  while (t_ < steps) Advance();
}

}  // namespace zerort
