// ZeroOneSchedule (zero_one_schedule.h): DeepSpeed's zoadam.py counters, step by step.
#include "zerort/sharding/zero_one_schedule.h"

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

// The step count comes from a checkpoint (untrusted, up to 2^63): Advance's effect over `steps`
// steps in O(log) work, not a loop over them.
void ZeroOneSchedule::Restore(int64_t steps) {
  *this = ZeroOneSchedule(o_);
  if (steps <= 0) return;
  Advance();  // the initialisation step
  // Before the freeze (the last unfrozen step: the first after var_freeze_step, and not step 1):
  // jump from one variance update that doubles the interval to the next.
  const int64_t open_until = std::min(steps, std::max<int64_t>(o_.var_freeze_step + 1, 2));
  while (t_ < open_until) {
    const int64_t interval = var_interval_;
    const int64_t next = (t_ / interval + 1) * interval;  // the next variance step
    const int64_t doubles = next + (o_.var_update_scaler - var_counter_ - 1) * interval;
    if (doubles <= open_until) {
      t_ = doubles;
      var_counter_ = 0;
      var_interval_ *= 2;
    } else {
      if (next <= open_until) var_counter_ += (open_until - next) / interval + 1;
      t_ = open_until;
    }
  }
  reduce_next_ = (t_ + 1) % var_interval_ == 0;
  if (t_ >= 2 && t_ > o_.var_freeze_step) frozen_ = true;
  if (steps == t_) return;
  // Frozen steps: the local-step interval doubles every local_step_scaler of them, capped.
  const int64_t frozen_steps = steps - t_;
  errors_reset_ = true;
  local_counter_ = frozen_steps % o_.local_step_scaler;
  for (int64_t k = frozen_steps / o_.local_step_scaler;
       k > 0 && local_interval_ < o_.local_step_clipper; --k) {
    local_interval_ = std::min<int64_t>(o_.local_step_clipper, local_interval_ * 2);
  }
  t_ = steps;
}

}  // namespace zerort
