// Learning-rate schedules with DeepSpeed's names and formulas (deepspeed/runtime/lr_schedules.py):
//   WarmupLR:       warmup_min_lr -> warmup_max_lr over warmup_num_steps (log or linear), then flat
//   WarmupDecayLR:  the same warm-up, then linear decay to 0 at total_num_steps
//   WarmupCosineLR: a ratio of the optimizer's lr: warmup_min_ratio -> 1 over the warm-up, then
//                   cosine down to cos_min_ratio at total_num_steps
// No scheduler: the optimizer's lr throughout. `iteration` is the 0-based index of the optimizer
// step about to be taken, so the first step uses iteration 0 (DeepSpeed's last_batch_iteration).
#pragma once

#include <cstdint>

#include "zerort/config/config.h"

namespace zerort {

double LearningRate(const OptimizerConfig& optimizer, const SchedulerConfig& scheduler,
                    int64_t iteration);

}  // namespace zerort
