// ZeroOneSchedule: which of DeepSpeed's 0/1 Adam steps step t is ([Note: 0/1 Adam],
// compressed_allreduce.h), as its zoadam.py counts them. Before var_freeze_step the variance is
// updated at steps that are multiples of an interval which doubles after every var_update_scaler
// updates, and exactly those steps all-reduce the gradient in full (the others compress it);
// steps after var_freeze_step + 1 are local, synchronising at multiples of an interval which
// doubles every local_step_scaler steps up to local_step_clipper. A pure function of the step
// count and the options: a resumed run replays it (Restore).
#pragma once

#include <cstdint>

#include "zerort/sharding/options.h"

namespace zerort {

struct ZeroOneStep {
  bool init = false;          // step 1: DeepSpeed's initialisation step, nothing changes
  bool reduce = false;        // the gradient is all-reduced in full (the engine's flag)
  bool variance = false;      // before the freeze: m and v from the all-reduced gradient
  bool frozen = false;        // after var_freeze_step + 1: a local step
  bool reset_errors = false;  // the first frozen step: the compression errors start from zero
  bool sync = false;          // a frozen step that synchronises the accumulated steps
};

class ZeroOneSchedule {
 public:
  explicit ZeroOneSchedule(const OptimizerOptions& options) : o_(options) {}
  ZeroOneStep Next() const;     // step steps() + 1
  void Advance();               // after that step was taken
  void Restore(int64_t steps);  // as `steps` Advances, in O(log steps)
  int64_t steps() const { return t_; }

 private:
  OptimizerOptions o_;
  int64_t t_ = 0;  // steps taken
  int64_t var_interval_ = 1, var_counter_ = 0;
  int64_t local_interval_ = 1, local_counter_ = 0;
  bool frozen_ = false, reduce_next_ = true, errors_reset_ = false;
};

}  // namespace zerort
