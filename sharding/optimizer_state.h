// ShardedOptimizer's per-unit state and small helpers, shared by sharded_optimizer.cc and the
// NVMe step (nvme_step.cc); internal to sharding/.
#pragma once

#include <chrono>
#include <deque>

#include "zerort/offload/nvme_store.h"
#include "zerort/offload/task_pool.h"
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
  // zero), and its norm parts as of its last write. An in-memory host-tier shard's sum_sq too,
  // where norm_taken says the add that last wrote it took it ([Note: the norm taken by the last
  // add]); `adds` counts this step's adds, adds_last_step the step before's.
  bool grad_written = false;
  float sum_sq = 0.0f, nonfinite = 0.0f;
  bool norm_taken = false;
  int adds = 0, adds_last_step = 0;
  // An in-memory host-tier gradient shard still holding a finished step's sums: it reads as zero
  // ([Note: host gradient shards start stale]).
  bool grad_stale = false;
  bool in_norm = true;  // false: a tied copy that another rank counts
};

// [Note: the host step's write-backs]: the copies in flight, oldest first.
class ShardedOptimizer::WriteBacks {
 public:
  WriteBacks() = default;
  WriteBacks(const WriteBacks&) = delete;
  WriteBacks& operator=(const WriteBacks&) = delete;
  ~WriteBacks() { (void)Drain(0); }  // a failed step: the staging outlives its copies
  void Push(WriteBack w) { in_flight_.push_back(std::move(w)); }
  // Waits until at most `keep` copies are in flight, freeing the staging of the others.
  Status Drain(size_t keep) {
    Status status = absl::OkStatus();
    while (in_flight_.size() > keep) {
      const Status done = in_flight_.front().copied->Synchronize();
      if (status.ok()) status = done;
      in_flight_.pop_front();
    }
    return status;
  }

 private:
  std::deque<WriteBack> in_flight_;
};

// [Note: the host step behind the forward]: a step whose units are updated on the step worker
// and completed one by one (CompleteUnitStep), in unit order.
struct ShardedOptimizer::DeferredStep {
  struct UnitWork {
    Task task;                // the update, submitted `Ahead()` units before its completion
    TensorView out;           // where the update writes the compute values
    ::zerort::Buffer staged;  // `out`'s memory when the compute copy is on another device
    // [Note: gradient sums on the device]: the unit's gradient copied to the host, and the
    // event after that copy and the device shard's fill on the sums' stream (the update waits
    // for it).
    ::zerort::Buffer grad_staged;
    std::unique_ptr<Event> grad_copied;
    std::chrono::system_clock::time_point begin, end;  // the worker's update (spans)
  };
  OptimizerStepArgs args;
  std::vector<UnitWork> units;
  int submitted = 0;  // units whose update was submitted
  int completed = 0;  // units completed (CompleteUnitStep)
  WriteBacks write_backs;
  // [Note: gradient sums on the device]: recorded on the compute stream by the step, after the
  // last adds and the norm: what the sums' copies on their own stream wait for.
  std::unique_ptr<Event> grads_final;
};

namespace optimizer_internal {

inline constexpr int64_t kPage = NvmeStore::kAlignment;

inline TensorView HostF32(void* data, int64_t n) {
  return TensorView(data, DType::kF32, {n}, Device::Cpu());
}

}  // namespace optimizer_internal

}  // namespace zerort
