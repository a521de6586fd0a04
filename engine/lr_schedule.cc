// DeepSpeed's warm-up, decay and cosine schedules.
#include "zerort/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zerort {
namespace {

// The warm-up fraction in [0, 1] at `iteration` (1 once the warm-up is over).
double WarmupGamma(const SchedulerConfig& s, int64_t iteration) {
  if (iteration >= s.warmup_num_steps) return 1.0;
  if (s.warmup_type == "linear") {
    return static_cast<double>(iteration) / static_cast<double>(s.warmup_num_steps);
  }
  // log: log(iteration + 1) / log(warmup_num_steps); a warm-up of one step has nothing to log.
  if (s.warmup_num_steps <= 1) return 1.0;
  return std::log(static_cast<double>(iteration) + 1.0) /
         std::log(static_cast<double>(s.warmup_num_steps));
}

}  // namespace

double LearningRate(const OptimizerConfig& optimizer, const SchedulerConfig& s, int64_t iteration) {
  if (s.type.empty()) return optimizer.lr;
  if (s.type == "WarmupCosineLR") {
    if (iteration < s.warmup_num_steps) {
      const double ratio =
          s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * WarmupGamma(s, iteration);
      return optimizer.lr * ratio;
    }
    const double real_step = static_cast<double>(iteration - s.warmup_num_steps + 1);
    const double real_total = std::max<double>(1.0, s.total_num_steps - s.warmup_num_steps);
    const double cosine = (1.0 + std::cos(M_PI * std::min(1.0, real_step / real_total))) / 2.0;
    return optimizer.lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  // WarmupLR / WarmupDecayLR: lr = min + (max - min) * gamma, as DeepSpeed's get_lr.
  double gamma = WarmupGamma(s, iteration);
  if (s.type == "WarmupDecayLR" && iteration >= s.warmup_num_steps) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - iteration) /
                              std::max<double>(1.0, s.total_num_steps - s.warmup_num_steps));
  }
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

}  // namespace zerort
