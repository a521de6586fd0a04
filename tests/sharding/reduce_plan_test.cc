// [Note: the reduce plan] by hand: which units a bucket holds, and each path's buffers and
// collectives. GradientReducer runs these plans (shard_manager_test.cc and hybrid_shard_test.cc
// check its sums) and the memory model replays them (memory_grid_test.cc measures the
// buffers of every path against a real step, byte for byte).
#include "zerort/sharding/reduce_plan.h"

#include "gtest/gtest.h"
#include "zerort/kernels/quantize.h"

namespace zerort {
namespace {

using Path = ReducePlan::Path;

TEST(ReduceBucketTest, FillsToTheBucketSizeAndTakesEachUnitOnce) {
  ReduceBucket<int> bucket(25);
  EXPECT_FALSE(bucket.Add(0, 10));
  EXPECT_FALSE(bucket.Add(0, 10));  // another micro-batch: accumulated in place, not counted
  EXPECT_FALSE(bucket.Add(1, 10));
  EXPECT_TRUE(bucket.Add(2, 5));  // 25 of 25
  EXPECT_EQ(bucket.Take(), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(bucket.empty());
  EXPECT_TRUE(bucket.Add(3, 40));  // a unit of the bucket size or more is reduced alone
  EXPECT_EQ(bucket.Take(), (std::vector<int>{3}));
  EXPECT_FALSE(bucket.Add(0, 10));  // the count restarted with the bucket
}

// Two units of 12 and 20 padded elements over 4 ranks: shards of 3 and 5.
const std::vector<ReduceSizes> kTwo = {{12, 3}, {20, 5}};

TEST(ReducePlanTest, ReduceScatterPacksSeveralUnitsRankMajor) {
  const ReducePlan p = PlanReduceScatter(kTwo, {4, 1}, true, false);
  EXPECT_EQ(p.path, Path::kReduceScatter);
  EXPECT_EQ(p.total, 32);
  EXPECT_EQ(p.shards, 8);
  EXPECT_EQ(p.packed, 32);  // 4 ranks x 8
  EXPECT_EQ(p.reduced, 8);
  EXPECT_EQ(p.replica_shards, 0);
  EXPECT_EQ(p.group_op, CollectiveOp::kReduceScatter);
  EXPECT_EQ(p.group_count, 8);
  EXPECT_EQ(p.replica_count, 0);
  // One unit is rank-major already: no packing. With replicas, its shard crosses them.
  const ReducePlan one = PlanReduceScatter(std::span(kTwo).first(1), {4, 2}, true, false);
  EXPECT_EQ(one.packed, 0);
  EXPECT_EQ(one.reduced, 3);
  EXPECT_EQ(one.replica_count, 3);
}

TEST(ReducePlanTest, QuantizedReplacesTheCollective) {
  const ReducePlan p = PlanReduceScatter(kTwo, {4, 1}, true, true);
  EXPECT_EQ(p.path, Path::kQuantized);
  EXPECT_EQ(p.packed, 32);
  EXPECT_EQ(p.reduced, 8);
  EXPECT_EQ(p.group_count, 0);
}

TEST(ReducePlanTest, OneShardRankAddsStraightIntoTheShards) {
  const ReducePlan p = PlanReduceScatter(kTwo, {1, 1}, true, true);
  EXPECT_EQ(p.path, Path::kAddShards);
  EXPECT_EQ(p.packed + p.reduced + p.replica_shards + p.group_count + p.replica_count, 0);
  EXPECT_EQ(PlanReduceScatter(kTwo, {1, 3}, true, false).replica_count, 8);
  EXPECT_EQ(PlanReduceScatter({}, {4, 1}, true, false).path, Path::kNone);
}

TEST(ReducePlanTest, ReduceScatterFalseAllReducesTheFullGradients) {
  for (bool quantized : {false, true}) {  // reduce_scatter false wins over qgZ, as in the reducer
    const ReducePlan p = PlanReduceScatter(kTwo, {4, 1}, false, quantized);
    EXPECT_EQ(p.path, Path::kAllReduce);
    EXPECT_EQ(p.packed, 32);  // the full gradients end to end
    EXPECT_EQ(p.reduced, 0);
    EXPECT_EQ(p.group_op, CollectiveOp::kAllReduce);
    EXPECT_EQ(p.group_count, 32);
  }
  // With replicas only this rank's shards cross them, staged out of the packed gradients.
  const ReducePlan h = PlanReduceScatter(kTwo, {4, 2}, false, false);
  EXPECT_EQ(h.replica_shards, 8);
  EXPECT_EQ(h.replica_count, 8);
}

TEST(ReducePlanTest, AllReduceAtStagesZeroAndOne) {
  EXPECT_EQ(PlanAllReduce(kTwo, {1, 1}).path, Path::kNone);  // one data rank
  const ReducePlan one = PlanAllReduce(std::span(kTwo).first(1), {4, 1});
  EXPECT_EQ(one.packed, 0);  // in place
  EXPECT_EQ(one.group_count, 12);
  // A shard group of one with replicas: nothing in the group, the shards across the replicas.
  const ReducePlan r = PlanAllReduce(kTwo, {1, 2});
  EXPECT_EQ(r.path, Path::kAllReduce);
  EXPECT_EQ(r.group_count, 0);
  EXPECT_EQ(r.packed, 32);
  EXPECT_EQ(r.replica_shards, 8);
  EXPECT_EQ(r.replica_count, 8);
}

TEST(ReducePlanTest, QgzLevels) {
  // 16 elements (block quantization takes multiples of 8) on 2 nodes of 4: level 1 exchanges
  // the 2 blocks of each local index, level 2 one block.
  const QgzPlan p = PlanQgz(16, 2, 4);
  EXPECT_EQ(p.packed, 128);
  EXPECT_EQ(p.partial, 32);
  EXPECT_EQ(p.intra.peers, 4);
  EXPECT_EQ(p.intra.numel, 32);
  EXPECT_EQ(p.intra.bytes, QuantizedBytes(32));
  EXPECT_EQ(p.inter.peers, 2);
  EXPECT_EQ(p.inter.numel, 16);
  EXPECT_EQ(p.inter.bytes, QuantizedBytes(16));
  // One node: no ring across nodes; one rank per node: none inside.
  EXPECT_EQ(PlanQgz(16, 1, 4).inter.peers, 1);
  EXPECT_EQ(PlanQgz(16, 1, 4).inter.bytes, 0);
  EXPECT_EQ(PlanQgz(16, 4, 1).intra.bytes, 0);
}

}  // namespace
}  // namespace zerort
