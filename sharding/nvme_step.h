// The optimizer step on the NVMe tier (internal to sharding/).
//
// [Note: the NVMe optimizer step] A unit's master, moments and gradient shard live in the rank's
// NVMe file; the step streams them through the StagingPool's sets, chunk by chunk (sub_group_size
// elements, never spanning units). Reads run up to buffer_count - 1 chunks ahead (Issue); a
// chunk's update runs on the host when its reads have landed, then its writes start and its set
// returns to the pool fenced by them (Complete), so the next chunk's update overlaps them and a
// set is reused only after its writes. A failure stops issuing; the reads already in flight
// finish before their memory is reused (Abandon), and every write of the step has landed before
// the step returns (the pool drained).
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <vector>

#include "zerort/offload/nvme_store.h"
#include "zerort/offload/staging_pool.h"
#include "zerort/sharding/sharded_optimizer.h"

namespace zerort {

class ShardedOptimizer::NvmeStep {
 public:
  NvmeStep(ShardedOptimizer& optimizer, const OptimizerStepArgs& args);
  Status Run();

 private:
  struct Job {
    Chunk chunk;
    StagingPool::Lease lease;
    std::vector<IoHandle> reads;
    std::chrono::system_clock::time_point issued;  // its reads started (the trace's span)
  };
  // A staging set's five parts: master, exp_avg, exp_avg_sq, gradient, compute values.
  std::array<char*, 5> Buffers(const Job& j) const;
  Status Issue();          // the next chunk's reads into a staging set
  Status Complete(Job j);  // its reads awaited, the update, its writes started, its set returned
  void Abandon();          // after a failure: the in-flight reads finish, their sets return

  ShardedOptimizer& opt_;
  const OptimizerStepArgs& args_;
  NvmeStore& store_;
  const ShardManagerOptions& o_;
  const int64_t part_;  // bytes of one part of a staging set
  std::vector<Chunk> chunks_;
  std::deque<Job> in_flight_;
  size_t next_ = 0;
  double* io_wait_;
};

}  // namespace zerort
