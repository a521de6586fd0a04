// Hybrid sharding ([Note: hybrid sharding], runtime/device_mesh.h; HSDP, MiCS): the MLP trained
// with its state sharded over groups of ranks and replicated across them equals the flat ZeRO run
// over every rank and the unsharded reference (the same mean gradient: a reduction in the group,
// then one across the groups), at every stage, optimizer and reduction variant.
#include "gtest/gtest.h"
#include "tests/sharding/harness.h"
#include "zerort/runtime/strings.h"

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
  // Stage 1 sends only each rank's shard across the replicas: from the packed bucket, and (bucket
  // 1) from each unit's own gradient.
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
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

// [Note: hpZ]: gathers from the secondary copy move the same bytes in the same order, so the run
// is bitwise the one without it, flat or hybrid, offloaded or not, with several micro-batches and
// reused units; and most gathers then go to the secondary group.
TEST(HpzTest, SecondaryGathersChangeNoNumber) {
  RunConfig flat{.stage = ZeroStage::k3, .world = 4, .steps = 5};
  RunConfig hybrid = flat, offload = flat, micro = flat, reuse = flat, broadcast = flat;
  hybrid.shard_size = 4;
  hybrid.world = 8;
  offload.placement.params = MemoryTier::kHost;
  offload.placement.optimizer = MemoryTier::kHost;
  micro.micro_batches = 3;
  reuse.max_reuse_distance = 1'000'000'000;
  broadcast.allgather_partitions = false;
  for (RunConfig c : {flat, hybrid, offload, micro, reuse, broadcast}) {
    const RunResult without = Train(c);
    c.hpz = 2;
    const RunResult with = Train(c);
    ASSERT_EQ(without.error, "") << Describe(c);
    ASSERT_EQ(with.error, "") << Describe(c);
    EXPECT_EQ(with.params, without.params) << Describe(c);
    EXPECT_GT(MaxRelativeError(with.params, MlpReference(Options(c).seed).params), 1e-3);
  }
}

TEST(HpzTest, BackwardGathersGoToTheSecondaryGroup) {
  for (int micro : {1, 3}) {
    RunConfig c{.stage = ZeroStage::k3, .world = 4, .micro_batches = micro, .steps = 3, .hpz = 2};
    const RunResult r = Train(c);
    ASSERT_EQ(r.error, "");
    // Per step and unit: the first forward gather is primary; the backward's and every later
    // micro-batch's (2 x micro - 1 in all) read the secondary copy.
    EXPECT_EQ(r.secondary_gathers, r.primary_gathers * (2 * micro - 1)) << "micro " << micro;
    EXPECT_GT(r.primary_gathers, 0);
  }
}

TEST(HpzTest, TheSecondaryCopyIsPlannedAndCounted) {
  RunConfig c{.stage = ZeroStage::k3, .world = 4, .steps = 2};
  const RunResult without = Train(c);
  c.hpz = 2;
  const RunResult with = Train(c);
  ASSERT_EQ(with.error, "");
  // padded / hpz compute elements per unit, resident: half of what the rank's shard of 1/4 adds
  // twice over.
  EXPECT_EQ(with.parameter_peak - without.parameter_peak, with.secondary_bytes);
  EXPECT_GT(with.secondary_bytes, 0);
}

// qwZ: int8 weight gathers change the weights the model reads by at most half a quantization step
// per group, alike on every rank: the run stays close to the unquantized one but is not it; with
// hpZ (the copy keeps the dequantized weights), with hybrid sharding and host offload too.
TEST(QwzTest, QuantizedGathersStayCloseToTheExactRun) {
  RunConfig base{.stage = ZeroStage::k3, .world = 4, .steps = 10};
  RunConfig hpz = base, hybrid = base, offload = base;
  hpz.hpz = 2;
  hybrid.shard_size = 2;
  offload.placement.params = MemoryTier::kHost;
  offload.placement.optimizer = MemoryTier::kHost;
  for (RunConfig c : {base, hpz, hybrid, offload}) {
    const RunResult exact = Train(c);
    c.qwz = true;
    const RunResult quantized = Train(c);
    ASSERT_EQ(quantized.error, "") << Describe(c);
    const double err = MaxRelativeError(quantized.params, exact.params);
    EXPECT_GT(err, 0.0) << Describe(c);
    EXPECT_LT(err, 2e-2) << Describe(c);
  }
}

// qgZ ([Note: qgZ]): the gradient reduce-scatter in int8, in the node then across: close to the
// exact run, not equal; deterministic; nodes of 2 and 4 out of 4 and 8, one node, with
// micro-batches, buckets of one unit and predivide.
TEST(QgzTest, QuantizedReductionStaysCloseToTheExactRun) {
  RunConfig two_nodes{.stage = ZeroStage::k3, .world = 4, .steps = 10, .qgz_local = 2};
  RunConfig one_node = two_nodes, four_nodes = two_nodes, micro = two_nodes, bucket = two_nodes,
            predivide = two_nodes;
  one_node.qgz_local = 4;
  four_nodes.world = 8;
  four_nodes.qgz_local = 2;
  micro.micro_batches = 3;
  bucket.reduce_bucket_size = 1;
  predivide.predivide = 4.0;
  for (RunConfig c : {two_nodes, one_node, four_nodes, micro, bucket, predivide}) {
    const RunResult quantized = Train(c);
    ASSERT_EQ(quantized.error, "") << Describe(c);
    EXPECT_EQ(Train(c).params, quantized.params) << "deterministic: " << Describe(c);
    c.qgz_local = 0;
    const RunResult exact = Train(c);
    const double err = MaxRelativeError(quantized.params, exact.params);
    EXPECT_GT(err, 0.0) << Describe(c);
    EXPECT_LT(err, 2e-2) << Describe(c);
  }
}

}  // namespace
}  // namespace zerort
