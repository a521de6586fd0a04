// GradientReducer: reduces the full gradients of units over the data-parallel group, packing
// units smaller than reduce_bucket_size into one collective. Which units go together, which
// buffers each reduction takes and what each collective sends is the reduce plan's
// ([Note: the reduce plan], reduce_plan.h), which the memory model replays.
//
// Stages 2-3 (reduce-scatter, as each unit's backward ends): a bucket of units U1..Uk with shard
// sizes s1..sk is packed rank-major — for each rank r, the r-th shard of U1, then of U2, ... —
// so one reduce-scatter of count s1+...+sk hands every rank exactly its shard of every unit,
// which is then added to the units' fp32 gradient shards. A unit of reduce_bucket_size elements
// or more is reduced alone, without packing.
// Stages 0-1 (all-reduce, at the step): units are concatenated up to the bucket size, one
// all-reduce per bucket.
// The mean over ranks is a sum divided by the data-parallel size after the reduction, or, with
// DeepSpeed's gradient_predivide_factor f (prescale_gradients: f = dp), divided by f before and
// by dp / f after (the same mean up to rounding; a smaller sum where overflow is a risk).
// With hybrid sharding ([Note: hybrid sharding]) each reduction in the shard group is followed by
// an all-reduce of its result across the replicas (the shard, or the full gradient at stages 0-1),
// and the mean divides by every data rank: reduce-scatter in the group, all-reduce across groups.
// Work runs on the comm stream after the compute stream's gradients (an event), and the compute
// stream waits for the comm stream before the optimizer reads the gradient shards.
#pragma once

#include <memory>
#include <vector>

#include "zerort/sharding/quantized_reduce.h"
#include "zerort/sharding/reduce_plan.h"
#include "zerort/sharding/sharded_optimizer.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

class GradientReducer {
 public:
  // Reduced gradients are added into `optimizer`'s gradient shards.
  GradientReducer(const UnitResources& resources, ShardedOptimizer* optimizer);

  // Stages 2-3: the unit's backward ended; reduces now or when the bucket is full.
  Status Add(ShardedUnit& unit);
  // Reduces whatever is pending (stages 2-3), or every unit's full gradient (stages 0-1), and
  // makes the compute stream wait for the result. `reduce` false (stages 0-1: 1-bit Adam's
  // compressed steps, [Note: 1-bit Adam]): each rank keeps its own gradient.
  Status Finish(std::vector<std::unique_ptr<ShardedUnit>>& units, bool reduce = true);
  int64_t collectives() const { return collectives_; }  // issued so far, for tests

 private:
  // Stages 2-3: the pending bucket's reduction (PlanReduceScatter).
  Status Flush();
  // An all-reduce of `bucket`'s full gradients (PlanAllReduce).
  Status AllReduce(const std::vector<ShardedUnit*>& bucket);
  static std::vector<ReduceSizes> Sizes(const std::vector<ShardedUnit*>& units);
  ReduceGroups Groups() const;
  Status CommAfterCompute();
  int DataRanks() const;  // the shard group's size times the replicas'
  Status AcrossReplicas(void* data, int64_t count, ReduceOp op, const std::string& what);
  // gradient_predivide_factor: scales the units' full gradients before the reduction and says
  // which reduction to run; PostDivide scales its result.
  StatusOr<ReduceOp> PreDivide(const std::vector<ShardedUnit*>& units, Stream* stream) const;
  Status PostDivide(const TensorView& reduced, Stream* stream) const;

  UnitResources resources_;
  ShardedOptimizer* optimizer_;
  ReduceBucket<ShardedUnit*> pending_;
  int64_t collectives_ = 0;
  std::unique_ptr<Event> event_;
  std::unique_ptr<QuantizedReduceScatter> quantized_;  // qgZ ([Note: qgZ])
};

}  // namespace zerort
