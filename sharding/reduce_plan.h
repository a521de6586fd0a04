// What the gradient reducer does with the units' full gradients, decided from sizes alone: the
// plan GradientReducer runs and the memory model (estimate/step_model.cc) replays, so that the two
// cannot drift (as GatherPlanner is for the gathers).
//
// [Note: the reduce plan]
// Buckets (ReduceBucket): units join in the order they come (stages 2-3: as each unit's backward
// ends, a unit already waiting only once, its next micro-batch accumulated in place; stages 0-1:
// every unit in layout order at the step) until their padded elements reach reduce_bucket_size;
// then the bucket is reduced, and whatever is left at the step. A bucket's reduction
// (ReducePlan) says which path it takes, the buffers it allocates (in this order, each given back
// when the reduction ends) and the elements of each collective:
//   kAddShards     stages 2-3, a shard group of one rank: every full gradient is its own shard,
//                  added straight into it; no buffer. With replicas, each unit all-reduced across
//                  them first.
//   kReduceScatter stages 2-3: one reduce-scatter of `shards` elements into `reduced` (this
//                  rank's shard of every unit, end to end); one unit is already rank-major and is
//                  reduced from its full gradient, several are first packed rank-major into
//                  `packed` (S x shards). With replicas, `reduced` is all-reduced across them.
//   kQuantized     as kReduceScatter, the collective replaced by qgZ (QgzPlan, [Note: qgZ]).
//   kAllReduce     stages 0-1, and stages 2-3 with reduce_scatter false: one all-reduce of
//                  `total` elements (skipped with a shard group of one), in place for one unit,
//                  through `packed` (the full gradients end to end) for several; with replicas,
//                  only this rank's shard of each unit crosses them, copied into
//                  `replica_shards` when packed.
//   kNone          nothing to reduce: an empty bucket, or one data rank at stages 0-1.
// The plan counts elements of the reduce dtype; the caller multiplies by its size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "zerort/runtime/communicator.h"

namespace zerort {

// The units waiting to be reduced together; `U` names a unit (the runtime's ShardedUnit*, the
// memory model's index).
template <typename U>
class ReduceBucket {
 public:
  explicit ReduceBucket(int64_t bucket_numel) : bucket_numel_(bucket_numel) {}

  // Adds `unit` (`padded_numel` elements) unless it waits already; true when the bucket is then
  // full and is to be reduced now.
  bool Add(U unit, int64_t padded_numel) {
    if (std::find(units_.begin(), units_.end(), unit) != units_.end()) return false;
    units_.push_back(unit);
    numel_ += padded_numel;
    return numel_ >= bucket_numel_;
  }
  bool empty() const { return units_.empty(); }
  // The units in the order they joined; the bucket is empty after.
  std::vector<U> Take() {
    numel_ = 0;
    return std::exchange(units_, {});
  }

 private:
  int64_t bucket_numel_;
  int64_t numel_ = 0;
  std::vector<U> units_;
};

// One unit's elements: its full (padded) gradient and its shard of it.
struct ReduceSizes {
  int64_t padded = 0;
  int64_t shard = 0;
};

struct ReducePlan {
  enum class Path { kNone, kAddShards, kReduceScatter, kQuantized, kAllReduce };
  Path path = Path::kNone;
  int64_t total = 0;   // the units' padded elements
  int64_t shards = 0;  // this rank's shard of each unit, end to end
  // Buffers, in allocation order (0: not allocated).
  int64_t packed = 0;
  int64_t reduced = 0;
  int64_t replica_shards = 0;
  // Collectives: in the shard group (0: none; kQuantized runs QgzPlan instead), then across the
  // replicas (0: none; kAddShards: one all-reduce per unit, these elements in all).
  CollectiveOp group_op = CollectiveOp::kAllReduce;
  int64_t group_count = 0;
  int64_t replica_count = 0;
};

struct ReduceGroups {
  int shard_ranks = 1;  // the shard group's size
  int replicas = 1;     // hybrid sharding's replica groups (1: none)
};

// Stages 2-3, a bucket flushed (GradientReducer::Flush). `quantized`: qgZ is on.
ReducePlan PlanReduceScatter(std::span<const ReduceSizes> units, ReduceGroups groups,
                             bool reduce_scatter, bool quantized);
// Stages 0-1 at the step, and stages 2-3 with reduce_scatter false (GradientReducer::AllReduce).
ReducePlan PlanAllReduce(std::span<const ReduceSizes> units, ReduceGroups groups);

// qgZ's buffers and rings for `count` elements per rank over `nodes` nodes of `local` ranks
// ([Note: qgZ], quantized_reduce.h).
struct QgzPlan {
  // One level's ring: `peers` ranks exchanging int8 chunks of `numel` values, `bytes` each way
  // per peer; its buffers are two of `bytes` and one of `numel` fp32 values (0 peers - 1: no ring).
  struct Level {
    int peers = 1;
    int64_t numel = 0;
    int64_t bytes = 0;
  };
  int64_t packed = 0;   // fp32 elements: the blocks reordered for level 1
  int64_t partial = 0;  // fp32 elements: the node-partial sums
  Level intra, inter;
};
QgzPlan PlanQgz(int64_t count, int nodes, int local);

}  // namespace zerort
