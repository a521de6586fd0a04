// The shard manager's backbone test: the same training run at ZeRO stages 0-3 and world sizes
// 1-4 (loopback ranks), with AdamW and with SGD + Nesterov momentum, against a single-process
// unsharded reference; gradients compared shard by shard; gradient accumulation; clipping;
// fp16 loss scaling with an inf on one rank; bf16 compute; the state machine's death tests;
// memory accounted per category against the layout.
#include "zerort/sharding/shard_manager.h"
#include "zerort/sharding/manager_state.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/sharding/harness.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

using namespace testing;  // the harness: RunConfig, Train, Reference, MaxRelativeError, MLP

struct EquivalenceCase {
  ZeroStage stage;
  int world;
  OptimizerKind optimizer;
};

class StageEquivalence : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(StageEquivalence, MatchesUnshardedReference) {
  const EquivalenceCase p = GetParam();
  RunConfig c{.stage = p.stage, .world = p.world, .optimizer = p.optimizer};
  const RunResult run = Train(c);
  ASSERT_EQ(run.error, "");
  const MlpReference ref = Reference(c, nullptr);
  ASSERT_EQ(run.params.size(), ref.params.size());
  const double err = MaxRelativeError(run.params, ref.params);
  EXPECT_LE(err, 1e-6) << "stage " << static_cast<int>(p.stage) << " world " << p.world;
  if (p.world == 1) {
    // One rank sums in the reference's order and the kernels agree bitwise: so must the run.
    EXPECT_EQ(run.params, ref.params) << "stage " << static_cast<int>(p.stage);
  }
  if (p.stage != ZeroStage::k0) {
    // At a given world size every stage does the same arithmetic on every element (the
    // loopback reductions sum ranks in a fixed order): the stages agree bitwise.
    RunConfig stage0 = c;
    stage0.stage = ZeroStage::k0;
    if (p.optimizer == OptimizerKind::kLamb && p.world > 1) {
      // LAMB's norms are sums over the shards' pieces, added in the group's order: the same
      // ratio to rounding, not bitwise.
      EXPECT_LE(MaxRelativeError(run.params, Train(stage0).params), 1e-6)
          << "stage " << static_cast<int>(p.stage) << " vs 0";
    } else {
      EXPECT_EQ(run.params, Train(stage0).params)
          << "stage " << static_cast<int>(p.stage) << " vs 0";
    }
  }
  // The run moved: the parameters are not their initial values.
  EXPECT_GT(MaxRelativeError(run.params, MlpReference(Options(c).seed).params), 1e-3);
}

std::vector<EquivalenceCase> AllCases() {
  std::vector<EquivalenceCase> cases;
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kLamb}) {
    for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
      for (int world : {1, 2, 3, 4}) cases.push_back({stage, world, opt});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesWorldsOptimizers, StageEquivalence, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<EquivalenceCase>& info) {
                           return StrCat(info.param.optimizer == OptimizerKind::kSgd    ? "Sgd"
                                         : info.param.optimizer == OptimizerKind::kLamb ? "Lamb"
                                                                                        : "AdamW",
                                         "Stage", static_cast<int>(info.param.stage), "World",
                                         info.param.world);
                         });

TEST(ShardManagerTest, GradientShardsMatchReferenceSliceBySlice) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    const int world = 3;
    MlpReference ref(Options({}).seed);
    ref.Backward(0, kGlobalBatch);
    std::vector<std::string> errors(world);
    ASSERT_TRUE(
        RunLoopbackRanks(world, {}, nullptr, [&](Communicator& comm) -> Status {
          MemoryTracker tracker;
          RunConfig c{.stage = stage, .world = world};
          ZR_ASSIGN_OR_RETURN(MlpRun run, MakeMlpRun(Options(c), comm, tracker));
          ShardManager* m = run.manager.get();
          const std::vector<int>& units = run.units;
          const int per_rank = kGlobalBatch / world;
          ZR_RETURN_IF_ERROR(
              MlpForwardBackward(*m, units, comm.rank() * per_rank, per_rank, 1.0f).status());
          ZR_RETURN_IF_ERROR(m->ReduceGradients());
          int k = 0;
          for (int u : units) {
            const FlatLayout& layout = m->unit(u).layout();
            const float* shard = m->optimizer().GradShard(u).data_as<float>();
            for (const ShardPiece& piece : layout.ShardPieces(comm.rank())) {
              const std::vector<float>& want = ref.grads[k + piece.param];
              // Ranks sum their samples apart, then average: the difference from one sum over the
              // batch is rounding of the terms, so it is measured against the tensor's scale.
              float scale = 0;
              for (float w : want) scale = std::max(scale, std::abs(w));
              for (int64_t i = 0; i < piece.param_range.size(); ++i) {
                const float got = shard[piece.shard_range.begin + i];
                const float w = want[piece.param_range.begin + i];
                if (std::abs(got - w) > 1e-5f * scale && errors[comm.rank()].empty()) {
                  errors[comm.rank()] = StrCat("unit ", u, " param ", piece.param, " element ",
                                               piece.param_range.begin + i, ": ", got, " vs ", w);
                }
              }
            }
            k += static_cast<int>(layout.params().size());
          }
          return absl::OkStatus();
        }).ok());
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(errors[r], "") << "stage " << static_cast<int>(stage) << " rank " << r;
  }
}

TEST(ShardManagerTest, AccumulatingMicroBatchesEqualsOneBatch) {
  for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k2, ZeroStage::k3}) {
    const RunResult one = Train({.stage = stage, .world = 2, .steps = 5});
    const RunResult four = Train({.stage = stage, .world = 2, .micro_batches = 3, .steps = 5});
    ASSERT_EQ(one.error, "");
    ASSERT_EQ(four.error, "");
    EXPECT_LE(MaxRelativeError(four.params, one.params), 1e-6)
        << "stage " << static_cast<int>(stage);
  }
}

TEST(ShardManagerTest, BucketingPacksSmallUnitsWithoutChangingANumber) {
  for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    RunConfig bucketed{.stage = stage, .world = 3, .steps = 4};
    RunConfig alone = bucketed;
    alone.reduce_bucket_size = 1;
    const RunResult a = Train(bucketed);
    const RunResult b = Train(alone);
    ASSERT_EQ(a.error, "");
    ASSERT_EQ(b.error, "");
    EXPECT_EQ(a.params, b.params) << "stage " << static_cast<int>(stage);
    // Four units: one collective per step when bucketed, four when each unit goes alone.
    EXPECT_EQ(a.gradient_collectives, 4) << "stage " << static_cast<int>(stage);
    EXPECT_EQ(b.gradient_collectives, 16) << "stage " << static_cast<int>(stage);
  }
}

TEST(ShardManagerTest, PersistentUnitsStayGatheredAndChangeNoNumber) {
  // Units below stage3_param_persistence_threshold elements are gathered once and kept; the
  // optimizer step re-gathers them. Every MLP unit is below 1000 elements.
  RunConfig persistent{
      .stage = ZeroStage::k3, .world = 3, .steps = 6, .persistence_threshold = 1000};
  RunConfig released = persistent;
  released.persistence_threshold = 0;
  const RunResult a = Train(persistent);
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.params, Train(released).params);
}

// [Note: one shard rank]: ZeRO-3 over a shard group of one rank reads each unit's compute shard
// in place (no gathered buffer, no gather), and trains bitwise as stage 0 does, with gradient
// accumulation and a checkpoint-style reload; where the note's exceptions apply (poisoned
// releases, parameters offloaded to the host, more than one shard rank) it gathers as before.
TEST(ShardManagerTest, OneShardRankReadsItsShardsInPlace) {
  for (DType compute : {DType::kF32, DType::kBF16}) {
    RunConfig c{.stage = ZeroStage::k3,
                .world = 1,
                .compute = compute,
                .micro_batches = 2,
                .steps = 8,
                .reload_after = 5};
    c.poison = false;
    const RunResult in_place = Train(c);
    ASSERT_EQ(in_place.error, "");
    EXPECT_EQ(in_place.gathered_peak, 0) << DTypeName(compute);
    EXPECT_EQ(in_place.primary_gathers, 0) << DTypeName(compute);
    RunConfig stage0 = c;
    stage0.stage = ZeroStage::k0;
    EXPECT_EQ(in_place.params, Train(stage0).params) << DTypeName(compute);

    RunConfig poisoned = c;  // the debugging aid keeps its gathers (and their NaN fills)
    poisoned.poison = true;
    const RunResult gathered = Train(poisoned);
    EXPECT_GT(gathered.gathered_peak, 0) << DTypeName(compute);
    EXPECT_GT(gathered.primary_gathers, 0) << DTypeName(compute);
    EXPECT_EQ(in_place.params, gathered.params) << DTypeName(compute);
  }
  RunConfig host{.stage = ZeroStage::k3, .world = 1, .steps = 4};
  host.poison = false;
  host.placement = {.optimizer = MemoryTier::kHost, .params = MemoryTier::kHost};
  const RunResult offloaded = Train(host);
  ASSERT_EQ(offloaded.error, "");
  EXPECT_GT(offloaded.gathered_peak, 0) << "a host-tier shard is copied to the device";
  host.persistence_threshold = 1000;  // every MLP unit: kept on the device, so read in place
  EXPECT_EQ(Train(host).gathered_peak, 0);

  RunConfig hybrid{.stage = ZeroStage::k3, .world = 2, .steps = 4, .shard_size = 1};
  hybrid.poison = false;
  const RunResult replicas = Train(hybrid);
  ASSERT_EQ(replicas.error, "");
  EXPECT_EQ(replicas.gathered_peak, 0) << "shard groups of one rank";
  RunConfig two = hybrid;
  two.shard_size = 0;
  const RunResult sharded = Train(two);
  EXPECT_GT(sharded.gathered_peak, 0);
  EXPECT_EQ(replicas.params, sharded.params);
}

// DeepSpeed's gradient_predivide_factor and prescale_gradients move the division by the world
// size around the reduction: the same mean up to rounding, at every stage (SGD with momentum:
// Adam would hide a wrong scale).
TEST(ShardManagerTest, PredividingTheGradientKeepsTheMean) {
  for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    RunConfig after{.stage = stage, .world = 4, .optimizer = OptimizerKind::kSgd, .steps = 4};
    const RunResult reference = Train(after);
    ASSERT_EQ(reference.error, "");
    for (double factor : {2.0, 4.0}) {  // 4: prescale_gradients at world size 4
      RunConfig before = after;
      before.predivide = factor;
      const RunResult r = Train(before);
      ASSERT_EQ(r.error, "");
      EXPECT_LE(MaxRelativeError(r.params, reference.params), 1e-6)
          << "stage " << static_cast<int>(stage) << ", factor " << factor;
    }
  }
}

// DeepSpeed's allgather_partitions = false: shards gathered by a broadcast per rank, the same
// weights bit for bit at every stage that gathers.
TEST(ShardManagerTest, BroadcastGatherChangesNoNumber) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    RunConfig gathered{.stage = stage, .world = 3, .steps = 4};
    RunConfig broadcast = gathered;
    broadcast.allgather_partitions = false;
    const RunResult a = Train(gathered), b = Train(broadcast);
    ASSERT_EQ(a.error, "");
    ASSERT_EQ(b.error, "");
    EXPECT_EQ(a.params, b.params) << "stage " << static_cast<int>(stage);
  }
}

// DeepSpeed's reduce_scatter = false: stage 2-3 gradients all-reduced, each rank keeping its
// shard; the same parameters (bucketed and one unit at a time).
TEST(ShardManagerTest, AllReduceInsteadOfReduceScatterChangesNoNumber) {
  for (ZeroStage stage : {ZeroStage::k2, ZeroStage::k3}) {
    for (int64_t bucket : {int64_t{500'000'000}, int64_t{1}}) {
      RunConfig scattered{.stage = stage,
                          .world = 3,
                          .optimizer = OptimizerKind::kSgd,
                          .steps = 4,
                          .reduce_bucket_size = bucket};
      RunConfig reduced = scattered;
      reduced.reduce_scatter = false;
      const RunResult a = Train(scattered), b = Train(reduced);
      ASSERT_EQ(a.error, "");
      ASSERT_EQ(b.error, "");
      EXPECT_LE(MaxRelativeError(a.params, b.params), 1e-6)
          << "stage " << static_cast<int>(stage) << " bucket " << bucket;
    }
  }
}

// stage3_max_reuse_distance: a unit used again soon stays gathered (the MLP's forward then its
// backward: unit l is reused after the units above it), within stage3_max_live_parameters; the
// same weights as releasing and gathering again. No prefetch, so that the peak of gathered bytes
// is what the release decisions leave.
TEST(ShardManagerTest, KeepingReusedUnitsGatheredChangesNoNumber) {
  int64_t largest = 0, all = 0;
  for (int l = 0; l < MlpLayers(); ++l) {
    const int64_t n = FlatLayout::Create(MlpUnitParams(l), 3)->padded_numel();
    largest = std::max(largest, n);
    all += n;
  }
  RunConfig released{.stage = ZeroStage::k3, .world = 3, .steps = 4};
  released.prefetch = 0;
  released.poison = false;  // the gathered peak is what this test measures
  const RunResult a = Train(released);
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.gathered_peak, largest * 4) << "one unit at a time";
  RunConfig kept = released;
  kept.max_reuse_distance = 1'000'000'000;
  const RunResult b = Train(kept);
  ASSERT_EQ(b.error, "");
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(b.gathered_peak, all * 4) << "every unit kept from its forward to its backward";
  kept.max_live = 2 * largest;  // the kept units and the next one within the live budget
  const RunResult c = Train(kept);
  ASSERT_EQ(c.error, "");
  EXPECT_EQ(a.params, c.params);
  EXPECT_LE(c.gathered_peak, 2 * largest * 4);
  EXPECT_GT(c.gathered_peak, largest * 4) << "something was kept";
}

// allgather_bucket_size at stages 1-2: the updated parameters all-gathered in pieces of at most
// that many elements (through a staging buffer; broadcasts write in place), the same weights.
TEST(ShardManagerTest, AllGatherInBucketsChangesNoNumber) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2}) {
    for (bool partitions : {true, false}) {
      // Units reduced alone: at stage 1 the staging buffer is the only communication buffer.
      RunConfig whole{.stage = stage, .world = 3, .steps = 4, .reduce_bucket_size = 1};
      whole.allgather_partitions = partitions;
      RunConfig pieces = whole;
      pieces.allgather_bucket_size = 3 * 7;  // 7 elements of each rank's shard per collective
      const RunResult a = Train(whole), b = Train(pieces);
      ASSERT_EQ(a.error, "");
      ASSERT_EQ(b.error, "");
      EXPECT_EQ(a.params, b.params) << "stage " << static_cast<int>(stage);
      if (stage == ZeroStage::k1) {
        EXPECT_EQ(a.comm_buffer_peak, 0);
        EXPECT_EQ(b.comm_buffer_peak, partitions ? 3 * 7 * 4 : 0) << "the staging buffer";
      }
    }
  }
}

TEST(ShardManagerTest, OverlapCommChangesNoNumber) {
  RunConfig overlapped{.stage = ZeroStage::k3, .world = 2, .steps = 4};
  RunConfig serial = overlapped;
  serial.overlap_comm = false;
  EXPECT_EQ(Train(overlapped).params, Train(serial).params);
}

TEST(ShardManagerTest, ClippingUsesTheGlobalNorm) {
  for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k3}) {
    RunConfig c{.stage = stage, .world = 3, .clip = 0.05f, .steps = 8};
    const RunResult run = Train(c);
    ASSERT_EQ(run.error, "");
    std::vector<double> ref_norms;
    const MlpReference ref = Reference(c, &ref_norms);
    for (size_t s = 0; s < ref_norms.size(); ++s) {
      EXPECT_NEAR(run.grad_norms[s], ref_norms[s], 1e-5 * ref_norms[s]) << "step " << s;
    }
    EXPECT_GT(ref_norms[0], c.clip) << "the test must actually clip";
    EXPECT_LE(MaxRelativeError(run.params, ref.params), 1e-6);
  }
}

// On the device tier and with the optimizer on the host (whose norm counts non-finite values only
// when the sum of squares is not finite: AccumulateNorm).
TEST(ShardManagerTest, InfOnOneRankMakesEveryRankSkipAndLowersTheScale) {
  const int world = 3;
  for (auto [stage, tier] : {std::pair{ZeroStage::k0, MemoryTier::kDevice},
                             {ZeroStage::k2, MemoryTier::kDevice},
                             {ZeroStage::k3, MemoryTier::kDevice},
                             {ZeroStage::k2, MemoryTier::kHost},
                             {ZeroStage::k3, MemoryTier::kHost}}) {
    std::vector<std::string> errors(world);
    ASSERT_TRUE(RunLoopbackRanks(world, {}, nullptr, [&](Communicator& comm) -> Status {
                  MemoryTracker tracker;
                  RunConfig c{.stage = stage, .world = world, .compute = DType::kF16};
                  c.placement.optimizer = tier;
                  ShardManagerOptions o = Options(c);
                  o.loss_scale.initial_scale_power = 8;
                  o.loss_scale.hysteresis = 1;
                  ZR_ASSIGN_OR_RETURN(MlpRun run, MakeMlpRun(o, comm, tracker));
                  ShardManager* m = run.manager.get();
                  const std::vector<int>& units = run.units;
                  const int per_rank = kGlobalBatch / world;
                  ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, units, comm.rank() * per_rank, per_rank,
                                                        m->loss_scale())
                                         .status());
                  ZR_ASSIGN_OR_RETURN(StepResult first, m->Step({.lr = kLr}));
                  std::vector<float> before(MlpUnitParams(0)[0].numel());
                  ZR_RETURN_IF_ERROR(ShardManagerState(*m).GatherMaster(units[0], 0, before));
                  // Only rank 1 sees an inf in its gradient.
                  ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, units,
                                                        kGlobalBatch + comm.rank() * per_rank,
                                                        per_rank, m->loss_scale(), comm.rank() == 1)
                                         .status());
                  ZR_ASSIGN_OR_RETURN(StepResult second, m->Step({.lr = kLr}));
                  std::vector<float> after(before.size());
                  ZR_RETURN_IF_ERROR(ShardManagerState(*m).GatherMaster(units[0], 0, after));
                  std::string& e = errors[comm.rank()];
                  if (first.skipped) e += "first step skipped; ";
                  if (!second.skipped) e += "second step not skipped; ";
                  if (second.loss_scale != 256.0f || m->loss_scale() != 128.0f)
                    e += StrCat("scale ", m->loss_scale(), "; ");
                  if (before != after) e += "parameters changed on a skipped step; ";
                  if (ShardManagerState(*m).skipped_steps() != 1 || second.step != 1)
                    e += "skip count; ";
                  // Training goes on after the skip.
                  ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, units,
                                                        2 * kGlobalBatch + comm.rank() * per_rank,
                                                        per_rank, m->loss_scale())
                                         .status());
                  ZR_ASSIGN_OR_RETURN(StepResult third, m->Step({.lr = kLr}));
                  if (third.skipped || third.step != 2) e += "third step; ";
                  return absl::OkStatus();
                }).ok());
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(errors[r], "") << "stage " << static_cast<int>(stage) << " tier "
                               << static_cast<int>(tier) << " rank " << r;
  }
}

TEST(ShardManagerTest, Bf16ComputeStaysCloseAcrossStagesAndWorlds) {
  // bf16 weights and gradients carry about 3 significant digits; with fp32 masters the runs of
  // different stages and world sizes stay within 2e-2 of the fp32 reference after 10 steps
  // (documented tolerance), and within 2e-2 of each other.
  const RunConfig base{.stage = ZeroStage::k0, .world = 1, .compute = DType::kBF16, .steps = 10};
  const RunResult anchor = Train(base);
  ASSERT_EQ(anchor.error, "");
  const MlpReference ref = Reference(base, nullptr);
  EXPECT_LE(MaxRelativeError(anchor.params, ref.params), 2e-2);
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    for (int world : {2, 4}) {
      RunConfig c = base;
      c.stage = stage;
      c.world = world;
      const RunResult run = Train(c);
      ASSERT_EQ(run.error, "");
      EXPECT_LE(MaxRelativeError(run.params, anchor.params), 2e-2)
          << static_cast<int>(stage) << "/" << world;
    }
  }
}

TEST(ShardManagerTest, Stage3MemoryMatchesTheLayoutAndTheGatherBudget) {
  const int world = 4;
  std::vector<std::string> errors(world);
  ASSERT_TRUE(
      RunLoopbackRanks(world, {}, nullptr, [&](Communicator& comm) -> Status {
        MemoryTracker tracker;
        RunConfig c{.stage = ZeroStage::k3, .world = world};
        c.poison = false;  // the gathered peak is what this test measures
        ShardManagerOptions o = Options(c);
        // Room for two units gathered at once: the one in use and one prefetched.
        int64_t largest = 0;
        for (int l = 0; l < MlpLayers(); ++l) {
          auto layout = *FlatLayout::Create(MlpUnitParams(l), world);
          largest = std::max(largest, layout.padded_numel());
        }
        o.stage3_max_live_parameters = 2 * largest;
        ZR_ASSIGN_OR_RETURN(MlpRun run, MakeMlpRun(o, comm, tracker));
        ShardManager* m = run.manager.get();
        const std::vector<int>& units = run.units;
        int64_t shard_total = 0;
        for (int u : units) shard_total += m->unit(u).layout().shard_numel();
        std::string& e = errors[comm.rank()];
        const MemorySnapshot s = tracker.Snapshot();
        // AdamW: master (fp32) and compute shard (fp32) are parameters; exp_avg and exp_avg_sq.
        if (s.Get(MemoryTier::kDevice, MemoryCategory::kParameters).current != 2 * 4 * shard_total)
          e += "parameters; ";
        if (s.Get(MemoryTier::kDevice, MemoryCategory::kOptimizerState).current !=
            2 * 4 * shard_total)
          e += "optimizer state; ";
        if (s.Get(MemoryTier::kDevice, MemoryCategory::kGatheredWeights).current != 0)
          e += "gathered at rest; ";
        tracker.ResetPeaks();
        for (int step = 0; step < 3; ++step) {
          ZR_RETURN_IF_ERROR(
              MlpForwardBackward(*m, units, step * kGlobalBatch + comm.rank() * 3, 3, 1.0f)
                  .status());
          ZR_RETURN_IF_ERROR(m->Step({.lr = kLr}).status());
        }
        const int64_t peak =
            tracker.Usage(MemoryTier::kDevice, MemoryCategory::kGatheredWeights).peak;
        if (peak > 2 * largest * 4)
          e += StrCat("gathered peak ", peak, " over budget ", 2 * largest * 4, "; ");
        if (peak < largest * 4) e += "nothing was gathered; ";
        if (tracker.Usage(MemoryTier::kDevice, MemoryCategory::kGatheredWeights).current != 0)
          e += "gathered after step; ";
        return absl::OkStatus();
      }).ok());
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(ShardManagerDeathTest, IllegalTransitionsStopWithTheUnitName) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  auto make = [](ZeroStage stage) {
    static MemoryTracker tracker;
    static std::unique_ptr<Allocator> allocator = MakeCpuCachingAllocator(&tracker);
    static std::vector<std::unique_ptr<Communicator>> comms = *CreateLoopbackGroup(1, {}, nullptr);
    auto m = *ShardManager::Create(Options({.stage = stage}),
                                   {.dp = comms[0].get(), .device_allocator = allocator.get()});
    ZR_CHECK_OK(m->AddUnit("fc0", MlpUnitParams(0)).status());
    ZR_CHECK_OK(m->Initialize(MlpInit));
    return m;
  };
  EXPECT_DEATH(
      {
        auto m = make(ZeroStage::k3);
        ShardManagerState(*m).unit(0).Param(0);
      },
      "unit 'fc0' read in state SHARDED");
  EXPECT_DEATH(
      {
        auto m = make(ZeroStage::k3);
        (void)ShardManagerState(*m).unit(0).Release();
      },
      "Release of unit 'fc0' in state SHARDED");
  EXPECT_DEATH(
      {
        auto m = make(ZeroStage::k3);
        ZR_CHECK_OK(ShardManagerState(*m).unit(0).StartGather());
        ShardManagerState(*m).unit(0).StartGather().IgnoreError();
      },
      "StartGather on unit 'fc0' in state GATHERING");
  EXPECT_DEATH(
      {
        auto m = make(ZeroStage::k3);
        ShardManagerState(*m).unit(0).FinishGather().IgnoreError();
      },
      "FinishGather on unit 'fc0' in state SHARDED");
  EXPECT_DEATH(
      {
        auto m = make(ZeroStage::k2);
        ShardManagerState(*m).unit(0).grad().Param(0);
      },
      "gradient of unit 'fc0' outside its backward");
}

// [Note: every rank registers the same units]: a unit registered with its weight transposed on
// one rank (the same number of elements, so the shards pad alike and used to train silently
// wrong), a missing unit, or another dtype fails Initialize on every rank, naming the unit and
// both ranks' versions of it.
TEST(ShardManagerTest, RanksThatRegisterDifferentUnitsFailInitializeNamingThem) {
  enum class Mistake { kNone, kTransposed, kMissing, kDtype };
  for (const Mistake mistake :
       {Mistake::kNone, Mistake::kTransposed, Mistake::kMissing, Mistake::kDtype}) {
    std::vector<Status> results(2);
    ASSERT_TRUE(RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) -> Status {
                  MemoryTracker tracker;
                  auto allocator = MakeCpuCachingAllocator(&tracker);
                  ShardManagerOptions o = Options({.stage = ZeroStage::k3, .world = 2});
                  const bool odd = comm.rank() == 1;
                  if (odd && mistake == Mistake::kDtype) o.reduce_dtype = DType::kBF16;
                  ZR_ASSIGN_OR_RETURN(
                      auto m,
                      ShardManager::Create(o, {.dp = &comm, .device_allocator = allocator.get()}));
                  ZR_RETURN_IF_ERROR(m->AddUnit("fc0", MlpUnitParams(0)).status());
                  std::vector<ParamSpec> fc1 = MlpUnitParams(1);
                  if (odd && mistake == Mistake::kTransposed) {
                    std::swap(fc1[0].shape[0], fc1[0].shape[1]);
                  }
                  if (!(odd && mistake == Mistake::kMissing)) {
                    ZR_RETURN_IF_ERROR(m->AddUnit("fc1", fc1).status());
                  }
                  results[comm.rank()] = m->Initialize(MlpInit);
                  return absl::OkStatus();
                }).ok());
    if (mistake == Mistake::kNone) {
      for (const Status& s : results) EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    const std::vector<int> w = MlpWidths();
    for (int r = 0; r < 2; ++r) {
      const Status& s = results[r];
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << s;
      const std::string m(s.message());
      EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
      if (mistake == Mistake::kTransposed) {
        EXPECT_NE(m.find(StrCat("fc1.weight [", w[2], ", ", w[1], "]")), std::string::npos) << m;
        EXPECT_NE(m.find(StrCat("fc1.weight [", w[1], ", ", w[2], "]")), std::string::npos) << m;
      } else if (mistake == Mistake::kMissing) {
        EXPECT_NE(m.find("unit 'fc1'"), std::string::npos) << m;
        EXPECT_NE(m.find("no more units"), std::string::npos) << m;
      } else {
        EXPECT_NE(m.find("reduce bf16"), std::string::npos) << m;
      }
    }
  }
}

// An initializer that depends on the rank (here: rank 1 shifts fc1.weight) fails Initialize on
// every rank, naming the parameter; at stage 0 every replica used to start from its own weights.
TEST(ShardManagerTest, RankDependentInitialValuesFailInitializeNamingTheParameter) {
  for (const ZeroStage stage : {ZeroStage::k0, ZeroStage::k3}) {
    for (const bool shifted : {false, true}) {
      std::vector<Status> results(2);
      ASSERT_TRUE(
          RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) -> Status {
            MemoryTracker tracker;
            auto allocator = MakeCpuCachingAllocator(&tracker);
            ZR_ASSIGN_OR_RETURN(
                auto m, ShardManager::Create(Options({.stage = stage, .world = 2}),
                                             {.dp = &comm, .device_allocator = allocator.get()}));
            for (int l = 0; l < MlpLayers(); ++l) {
              ZR_RETURN_IF_ERROR(m->AddUnit("fc" + std::to_string(l), MlpUnitParams(l)).status());
            }
            const int rank = comm.rank();
            results[rank] =
                m->Initialize([&](const ParamSpec& spec, uint64_t seed, std::span<float> full) {
                  MlpInit(spec, seed, full);
                  if (shifted && rank == 1 && spec.name == "fc1.weight") {
                    for (float& v : full) v += 1.0f;
                  }
                });
            return absl::OkStatus();
          }).ok());
      for (int r = 0; r < 2; ++r) {
        const Status& s = results[r];
        if (!shifted) {
          EXPECT_TRUE(s.ok()) << s;
          continue;
        }
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << s;
        EXPECT_NE(s.message().find("'fc1.weight' of unit 'fc1'"), std::string::npos) << s;
        EXPECT_NE(s.message().find("ranks 0 and 1"), std::string::npos) << s;
      }
    }
  }
}

TEST(ShardManagerTest, StepRefusesAGatheredUnitAndBadInputs) {
  MemoryTracker tracker;
  auto allocator = MakeCpuCachingAllocator(&tracker);
  auto comms = *CreateLoopbackGroup(1, {}, nullptr);
  auto m = *ShardManager::Create(Options({.stage = ZeroStage::k3}),
                                 {.dp = comms[0].get(), .device_allocator = allocator.get()});
  const int u = *m->AddUnit("fc0", MlpUnitParams(0));
  EXPECT_EQ(m->AddUnit("fc0", MlpUnitParams(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->Initialize(MlpInit).ok());
  EXPECT_EQ(m->AddUnit("late", MlpUnitParams(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  {
    UnitScope scope = *m->ForwardScope(u);
    EXPECT_EQ(m->Step({.lr = kLr}).status().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(m->Step({.lr = -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Step({.lr = kLr, .micro_batches = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->ForwardScope(7).status().code(), absl::StatusCode::kInvalidArgument);
  ShardManagerOptions offload = Options({});
  offload.stage = ZeroStage::k2;
  offload.placement.params = MemoryTier::kPinnedHost;  // DeepSpeed: parameters at stage 3 only
  const auto refused =
      ShardManager::Create(offload, {.dp = comms[0].get(), .device_allocator = allocator.get()});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("offload_param"), std::string_view::npos)
      << refused.status();
  offload.stage = ZeroStage::k0;
  offload.placement = {.optimizer = MemoryTier::kPinnedHost};
  EXPECT_NE(
      ShardManager::Create(offload, {.dp = comms[0].get(), .device_allocator = allocator.get()})
          .status()
          .message()
          .find("offload_optimizer"),
      std::string_view::npos);
}

// A unit whose Forward scope had no Backward scope before Step (a skipped layer backward, every
// step or once) fails Step on every rank that skipped it, naming the unit and the rank; with
// UnitOptions::needs_backward = false the same step is allowed (a frozen layer).
// [Note: host gradient shards start stale]: a host-tier shard is not zero-filled after a step, so
// a unit that gets no gradient in the next one (here fc1, whose backward is skipped) must still
// read zeros: its shard, the norm and the update, bitwise the device tier's.
TEST(ShardManagerTest, AUnitWithoutABackwardReadsZeroGradientsOnTheHostTier) {
  auto run = [](MemoryTier optimizer, std::vector<std::vector<float>>& params) {
    std::vector<std::string> errors(2);
    const Status status = RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) -> Status {
      MemoryTracker tracker;
      RunConfig c{.stage = ZeroStage::k3, .world = 2, .clip = 1.0f};
      c.placement.optimizer = optimizer;
      ZR_ASSIGN_OR_RETURN(MlpRun r, MakeMlpRun(Options(c), comm, tracker, Device::Cpu(), [](int l) {
                            return UnitOptions{.needs_backward = l != 1};
                          }));
      ShardManager* m = r.manager.get();
      ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, r.units, 6 * comm.rank(), 6, 1.0f).status());
      ZR_RETURN_IF_ERROR(m->Step({.lr = 0.01f}).status());
      for (int l = 0; l < MlpLayers(); ++l) {
        ZR_ASSIGN_OR_RETURN(UnitScope s, m->ForwardScope(r.units[l]));
        ZR_RETURN_IF_ERROR(s.End());
      }
      for (int l = MlpLayers() - 1; l >= 0; --l) {
        if (l == 1) continue;
        ZR_ASSIGN_OR_RETURN(UnitScope s, m->BackwardScope(r.units[l]));
        ZR_RETURN_IF_ERROR(s.End());
      }
      ZR_RETURN_IF_ERROR(m->ReduceGradients());
      const TensorView g = m->optimizer().GradShard(r.units[1]);
      for (int64_t i = 0; i < g.numel(); ++i) {
        if (g.data_as<float>()[i] != 0.0f && errors[comm.rank()].empty()) {
          errors[comm.rank()] =
              StrCat("fc1's gradient shard element ", i, " is ", g.data_as<float>()[i], ", not 0");
        }
      }
      ZR_RETURN_IF_ERROR(m->Step({.lr = 0.01f}).status());
      for (int u : r.units) {
        for (size_t i = 0; i < m->unit(u).layout().params().size(); ++i) {
          std::vector<float> full(m->unit(u).layout().params()[i].numel());
          ZR_RETURN_IF_ERROR(ShardManagerState(*m).GatherMaster(u, static_cast<int>(i), full));
          if (comm.rank() == 0) params.push_back(std::move(full));
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  };
  std::vector<std::vector<float>> device, host;
  run(MemoryTier::kDevice, device);
  run(MemoryTier::kHost, host);
  ASSERT_FALSE(device.empty());
  EXPECT_EQ(device, host);
}

TEST(ShardManagerTest, AUnitWithAForwardAndNoBackwardFailsStepNamingIt) {
  for (const ZeroStage stage : {ZeroStage::k1, ZeroStage::k3}) {
    for (const bool allowed : {false, true}) {
      std::vector<Status> results(2);
      ASSERT_TRUE(
          RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) -> Status {
            MemoryTracker tracker;
            ZR_ASSIGN_OR_RETURN(
                MlpRun run, MakeMlpRun(Options({.stage = stage, .world = 2}), comm, tracker,
                                       Device::Cpu(), [&](int l) {
                                         return UnitOptions{.needs_backward = !(allowed && l == 1)};
                                       }));
            ShardManager* m = run.manager.get();
            const std::vector<int>& units = run.units;
            // A good step, then one where fc1's backward is skipped.
            ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, units, 6 * comm.rank(), 6, 1.0f).status());
            ZR_RETURN_IF_ERROR(m->Step({.lr = 0.01f}).status());
            for (int l = 0; l < MlpLayers(); ++l) {
              ZR_ASSIGN_OR_RETURN(UnitScope s, m->ForwardScope(units[l]));
              ZR_RETURN_IF_ERROR(s.End());
            }
            for (int l = MlpLayers() - 1; l >= 0; --l) {
              if (l == 1) continue;
              ZR_ASSIGN_OR_RETURN(UnitScope s, m->BackwardScope(units[l]));
              ZR_RETURN_IF_ERROR(s.End());
            }
            results[comm.rank()] = m->Step({.lr = 0.01f}).status();
            return absl::OkStatus();
          }).ok());
      for (int r = 0; r < 2; ++r) {
        const Status& s = results[r];
        if (allowed) {
          EXPECT_TRUE(s.ok()) << s;
          continue;
        }
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_NE(s.message().find("unit 'fc1' had a Forward scope and no Backward scope"),
                  std::string::npos)
            << s;
        EXPECT_NE(s.message().find(StrCat("rank ", r, "/2")), std::string::npos) << s;
      }
    }
  }
}

}  // namespace
}  // namespace zerort
