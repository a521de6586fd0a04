// Options of the shard manager, named after DeepSpeed's config keys where DeepSpeed has one.
#pragma once

#include <cstdint>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/memory.h"

namespace zerort {

enum class ZeroStage : int { k0 = 0, k1 = 1, k2 = 2, k3 = 3 };

enum class OptimizerKind { kAdamW, kAdam, kSgd };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float beta1 = 0.9f;         // Adam(W) "betas"[0]
  float beta2 = 0.999f;       // Adam(W) "betas"[1]
  float eps = 1e-8f;          // Adam(W)
  float weight_decay = 0.0f;  // applied only to parameters whose ParamSpec says so
  float momentum = 0.0f;      // SGD
  float dampening = 0.0f;     // SGD
  bool nesterov = false;      // SGD
};

// fp16 dynamic loss scaling, DeepSpeed's "fp16" section. Unused for fp32/bf16 (scale 1).
struct LossScaleOptions {
  bool dynamic = true;           // "loss_scale": 0 means dynamic in DeepSpeed
  float static_scale = 1.0f;     // "loss_scale" when not dynamic
  int initial_scale_power = 16;  // initial scale 2^16
  int loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  int hysteresis = 2;            // overflows tolerated before the scale halves
  float min_loss_scale = 1.0f;
  int max_consecutive_skips = 50;  // then the run stops with a clear error (zerort's own)
};

// Where each shard buffer lives. Offload is a placement, not another code path: the unit asks
// for each buffer's tier. Only kDevice exists today; the offload issue adds kPinnedHost and kNvme
// (DeepSpeed's offload_optimizer moves master and state, offload_param the compute shard).
struct ShardPlacement {
  MemoryTier master = MemoryTier::kDevice;
  MemoryTier optimizer_state = MemoryTier::kDevice;
  MemoryTier compute_shard = MemoryTier::kDevice;
};

struct ShardManagerOptions {
  ZeroStage stage = ZeroStage::k3;
  DType compute_dtype = DType::kF32;  // gathered weights and activations
  DType reduce_dtype = DType::kF32;   // full gradients and their reduction
  OptimizerOptions optimizer;
  ShardPlacement placement;
  LossScaleOptions loss_scale;     // used when compute_dtype is f16
  float gradient_clipping = 0.0f;  // max global L2 norm; 0 disables
  bool overlap_comm = true;  // reduce gradients on the comm stream, overlapping backward compute
  int64_t reduce_bucket_size = 500'000'000;              // elements (DeepSpeed's default)
  int64_t stage3_prefetch_bucket_size = 50'000'000;      // elements issued ahead
  int64_t stage3_max_live_parameters = 1'000'000'000;    // elements gathered at once
  int64_t stage3_param_persistence_threshold = 100'000;  // smaller units stay gathered
  int64_t alignment = 16;                                // elements; see FlatLayout
  uint64_t seed = 1234;                                  // passed to initialisers
};

}  // namespace zerort
