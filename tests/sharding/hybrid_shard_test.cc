// Hybrid sharding ([Note: hybrid sharding], runtime/device_mesh.h; HSDP, MiCS): the MLP trained
// with its state sharded over groups of ranks and replicated across them equals the flat ZeRO run
// over every rank and the unsharded reference (the same mean gradient: a reduction in the group,
// then one across the groups), at every stage, optimizer and reduction variant.
#include "gtest/gtest.h"
#include "runtime/strings.h"
#include "tests/sharding/harness.h"

namespace zerort {
namespace {

using namespace testing;  // the harness: RunConfig, Train, Reference, MaxRelativeError, MLP

std::string Describe(const RunConfig& c) {
  return StrCat("stage ", static_cast<int>(c.stage), " world ", c.world, " shard ", c.shard_size,
                " optimizer ", static_cast<int>(c.optimizer), " clip ", c.clip, " predivide ",
                c.predivide, " reduce_scatter ", c.reduce_scatter, " bucket ", c.reduce_bucket_size,
                " micro ", c.micro_batches);
}

// The hybrid run equals the flat one to rounding (the sums' order differs) and the reference;
// it issues the flat run's gradient collectives plus one across the replicas for each.
void ExpectHybridEqualsFlat(RunConfig hybrid) {
  RunConfig flat = hybrid;
  flat.shard_size = 0;
  const RunResult a = Train(hybrid), b = Train(flat);
  ASSERT_EQ(a.error, "") << Describe(hybrid);
  ASSERT_EQ(b.error, "") << Describe(hybrid);
  EXPECT_LE(MaxRelativeError(a.params, b.params), 1e-6) << Describe(hybrid);
  EXPECT_LE(MaxRelativeError(a.params, Reference(hybrid, nullptr).params), 1e-6)
      << Describe(hybrid);
  EXPECT_GT(MaxRelativeError(a.params, MlpReference(Options(hybrid).seed).params), 1e-3);
  if (hybrid.shard_size > 1) {
    EXPECT_EQ(a.gradient_collectives, 2 * b.gradient_collectives) << Describe(hybrid);
  }
}

TEST(HybridShardTest, EveryStageAndOptimizerEqualsTheFlatRun) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kLamb}) {
      ExpectHybridEqualsFlat(
          {.stage = stage, .world = 4, .optimizer = opt, .steps = 8, .shard_size = 2});
    }
  }
}

TEST(HybridShardTest, ShardGroupsOfOneAndOfTwoOutOfSix) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k3}) {
    ExpectHybridEqualsFlat({.stage = stage, .world = 4, .steps = 6, .shard_size = 1});
    ExpectHybridEqualsFlat({.stage = stage, .world = 6, .steps = 6, .shard_size = 2});
    ExpectHybridEqualsFlat({.stage = stage, .world = 6, .steps = 6, .shard_size = 3});
  }
}

TEST(HybridShardTest, ReductionVariantsEqualTheFlatRun) {
  for (ZeroStage stage : {ZeroStage::k2, ZeroStage::k3}) {
    RunConfig base{.stage = stage, .world = 4, .steps = 6, .shard_size = 2};
    RunConfig clip = base, predivide = base, all_reduce = base, bucket = base, micro = base;
    clip.clip = 0.05f;
    predivide.predivide = 4.0;
    all_reduce.reduce_scatter = false;
    bucket.reduce_bucket_size = 1;
    micro.micro_batches = 3;  // 12 samples: 3 per rank, one per micro-batch
    for (const RunConfig& c : {clip, predivide, all_reduce, bucket, micro}) {
      ExpectHybridEqualsFlat(c);
    }
  }
}

TEST(HybridShardTest, OffloadedOptimizerEqualsTheFlatRun) {
  RunConfig c{.stage = ZeroStage::k3, .world = 4, .steps = 6, .shard_size = 2};
  c.placement.optimizer = MemoryTier::kHost;
  c.placement.params = MemoryTier::kHost;
  ExpectHybridEqualsFlat(c);
}

}  // namespace
}  // namespace zerort
