// ShardedOptimizer's per-unit state and small helpers, shared by sharded_optimizer.cc and the
// NVMe step (nvme_step.cc); internal to sharding/.
#pragma once

#include "zerort/offload/nvme_store.h"
#include "zerort/sharding/placed_buffer.h"
#include "zerort/sharding/sharded_optimizer.h"

namespace zerort {

struct ShardedOptimizer::UnitState {
  ShardedUnit* unit = nullptr;
  PlacedBuffer master, exp_avg, exp_avg_sq, grad;
  PlacedBuffer worker_error, server_error;  // 1-bit Adam, 0/1 Adam ([Note: 1-bit Adam])
  PlacedBuffer accumulator;                 // 0/1 Adam ([Note: 0/1 Adam])
  PlacedBuffer exp_avg_sq_fresh;            // 1-bit LAMB ([Note: 1-bit LAMB])
  std::vector<OneBitLambParam> lamb;        // 1-bit LAMB: per parameter, in layout order
  // NVMe gradient shards: whether the shard holds this step's gradient yet (else it reads as
  // zero), and its norm parts as of its last write.
  bool grad_written = false;
  float sum_sq = 0.0f, nonfinite = 0.0f;
  bool in_norm = true;  // false: a tied copy that another rank counts
};

namespace optimizer_internal {

inline constexpr int64_t kPage = NvmeStore::kAlignment;

inline TensorView HostF32(void* data, int64_t n) {
  return TensorView(data, DType::kF32, {n}, Device::Cpu());
}

}  // namespace optimizer_internal

}  // namespace zerort
