// Step agreement with tensor parallelism: two tensor-parallel ranks (each its own data-parallel
// group) hold halves of a split weight and each a copy of a replicated bias. The gradient norm
// both report is the whole model's (split halves summed over the model-parallel group, the
// replicated bias counted once, on tensor-parallel rank 0), on the device, host and NVMe tiers;
// a NaN on one rank makes both skip the step. And LAMB's trust ratio takes the split weight's
// whole norm.
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "gtest/gtest.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {
namespace {

constexpr int64_t kRows = 4, kCols = 3;

struct Result {
  double norm = 0;
  bool skipped = false;
};

// Rank r of 2 tensor-parallel ranks; `nan_on` puts a NaN into that rank's weight gradient.
Status TpRank(Communicator& mp, MemoryTier tier, int nan_on, int claimed_tp_rank,
              std::vector<Result>& out) {
  const int r = mp.rank();
  auto dp = *CreateLoopbackGroup(1, {}, nullptr);
  MemoryTracker tracker;
  auto allocator = MakeCpuCachingAllocator(&tracker);
  ShardManagerOptions o;
  o.stage = ZeroStage::k3;
  o.stage3_param_persistence_threshold = 0;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.placement = {.optimizer = tier};
  o.offload.nvme_path = std::filesystem::temp_directory_path().string();
  ZR_ASSIGN_OR_RETURN(auto m, ShardManager::Create(o, {.dp = dp[0].get(),
                                                       .device_allocator = allocator.get(),
                                                       .tracker = &tracker,
                                                       .model_parallel = &mp,
                                                       .tensor_parallel_rank = claimed_tp_rank}));
  ZR_ASSIGN_OR_RETURN(
      ParamSpec w, SplitParam("w", {kRows, kCols}, true, {.split_dim = 0, .parts = 2, .part = r}));
  ZR_ASSIGN_OR_RETURN(int u, m->AddUnit("layer", {w, ParamSpec{"b", {kRows}, false}}));
  ZR_RETURN_IF_ERROR(m->Initialize([](const ParamSpec&, uint64_t, std::span<float> full) {
    std::fill(full.begin(), full.end(), 1.0f);
  }));
  {
    ZR_ASSIGN_OR_RETURN(UnitScope fwd, m->ForwardScope(u));
    ZR_RETURN_IF_ERROR(fwd.End());
    ZR_ASSIGN_OR_RETURN(UnitScope s, m->BackwardScope(u));
    float* gw = s.grad(0).data_as<float>();
    for (int64_t i = 0; i < w.numel(); ++i) gw[i] += 0.1f * (GlobalIndex(w, i) + 1);
    if (nan_on == r) gw[0] = std::nanf("");
    float* gb = s.grad(1).data_as<float>();
    for (int64_t j = 0; j < kRows; ++j) gb[j] += 0.5f * (j + 1);  // identical on both ranks
    ZR_RETURN_IF_ERROR(s.End());
  }
  ZR_ASSIGN_OR_RETURN(StepResult step, m->Step({.lr = 0.0f}));
  out[r] = {step.grad_norm, step.skipped};
  return absl::OkStatus();
}

std::vector<Result> RunTwoRanks(MemoryTier tier, int nan_on = -1,
                                bool every_rank_claims_zero = false) {
  std::vector<Result> out(2);
  CommOptions options;
  options.timeout = std::chrono::seconds(20);
  const Status s = RunLoopbackRanks(2, options, nullptr, [&](Communicator& mp) {
    Status st = TpRank(mp, tier, nan_on, every_rank_claims_zero ? 0 : mp.rank(), out);
    if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", mp.rank(), st.ToString().c_str());
    return st;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

double WholeModelNorm() {
  double sq = 0;
  for (int g = 0; g < kRows * kCols; ++g) sq += std::pow(0.1f * (g + 1), 2);
  for (int j = 0; j < kRows; ++j) sq += std::pow(0.5f * (j + 1), 2);
  return std::sqrt(sq);
}

TEST(ModelParallelNorm, SplitPartsSummedAndReplicatedCountedOnce) {
  const double want = WholeModelNorm();
  for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kPinnedHost, MemoryTier::kNvme}) {
    const std::vector<Result> got = RunTwoRanks(tier);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NEAR(got[r].norm, want, 1e-5 * want) << MemoryTierName(tier) << " rank " << r;
      EXPECT_FALSE(got[r].skipped);
    }
  }
  // Counting the replicated bias on both ranks would give another norm: the rule matters.
  const std::vector<Result> doubled = RunTwoRanks(MemoryTier::kDevice, -1, true);
  EXPECT_GT(std::abs(doubled[0].norm - want), 1e-3 * want);
}

TEST(ModelParallelNorm, ANanOnOneTensorParallelRankSkipsTheStepOnBoth) {
  for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kNvme}) {
    const std::vector<Result> got = RunTwoRanks(tier, 1);
    EXPECT_TRUE(got[0].skipped) << MemoryTierName(tier);
    EXPECT_TRUE(got[1].skipped) << MemoryTierName(tier);
  }
}

// LAMB ([Note: LAMB with tensor parallelism]): a weight split over two tensor-parallel ranks gets
// the trust ratio of the whole weight, as one rank holding all of it does; the replicated bias
// its own. The weight's halves have different norms (it starts at 1 + its global index), so a
// ratio taken over one rank's half moves each half differently.
Status LambRank(Communicator& mp, int tp, std::vector<std::vector<float>>& out) {
  const int r = mp.rank();
  auto dp = *CreateLoopbackGroup(1, {}, nullptr);
  MemoryTracker tracker;
  auto allocator = MakeCpuCachingAllocator(&tracker);
  ShardManagerOptions o;
  o.stage = ZeroStage::k0;
  o.optimizer.kind = OptimizerKind::kLamb;
  o.optimizer.weight_decay = 0.1f;
  ZR_ASSIGN_OR_RETURN(auto m, ShardManager::Create(o, {.dp = dp[0].get(),
                                                       .device_allocator = allocator.get(),
                                                       .tracker = &tracker,
                                                       .model_parallel = tp > 1 ? &mp : nullptr,
                                                       .tensor_parallel_rank = r,
                                                       .tensor_parallel = &mp}));
  ZR_ASSIGN_OR_RETURN(
      ParamSpec w, SplitParam("w", {kRows, kCols}, true, {.split_dim = 0, .parts = tp, .part = r}));
  ZR_ASSIGN_OR_RETURN(int u, m->AddUnit("layer", {w, ParamSpec{"b", {kRows}, false}}));
  ZR_RETURN_IF_ERROR(m->Initialize([](const ParamSpec& p, uint64_t, std::span<float> full) {
    for (size_t i = 0; i < full.size(); ++i) {
      full[i] = p.name == "w" ? 1.0f + GlobalIndex(p, static_cast<int64_t>(i)) : 0.5f;
    }
  }));
  for (int step = 0; step < 3; ++step) {
    {
      ZR_ASSIGN_OR_RETURN(UnitScope fwd, m->ForwardScope(u));
      ZR_RETURN_IF_ERROR(fwd.End());
      ZR_ASSIGN_OR_RETURN(UnitScope s, m->BackwardScope(u));
      float* gw = s.grad(0).data_as<float>();
      for (int64_t i = 0; i < w.numel(); ++i) {
        const int64_t g = GlobalIndex(w, i);
        gw[i] += 0.1f * (g + 1) * (g % 3 == step ? -1.0f : 1.0f);
      }
      float* gb = s.grad(1).data_as<float>();
      for (int64_t j = 0; j < kRows; ++j) gb[j] += 0.5f * (j + 1);  // identical on both ranks
      ZR_RETURN_IF_ERROR(s.End());
    }
    ZR_RETURN_IF_ERROR(m->Step({.lr = 0.1f}).status());
  }
  ZR_ASSIGN_OR_RETURN(UnitScope fwd, m->ForwardScope(u));
  std::vector<float> global(kRows * kCols + kRows);
  const float* pw = fwd.param(0).data_as<float>();
  for (int64_t i = 0; i < w.numel(); ++i) global[GlobalIndex(w, i)] = pw[i];
  const float* pb = fwd.param(1).data_as<float>();
  std::copy(pb, pb + kRows, global.begin() + kRows * kCols);
  out[r] = std::move(global);
  return fwd.End();
}

std::vector<std::vector<float>> RunLamb(int tp) {
  std::vector<std::vector<float>> out(tp);
  const Status s = RunLoopbackRanks(tp, {}, nullptr, [&](Communicator& mp) {
    Status st = LambRank(mp, tp, out);
    if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", mp.rank(), st.ToString().c_str());
    return st;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(ModelParallelNorm, LambTakesASplitWeightsWholeNorm) {
  const std::vector<float> whole = RunLamb(1)[0];
  ASSERT_EQ(whole.size(), static_cast<size_t>(kRows * kCols + kRows));
  const std::vector<std::vector<float>> split = RunLamb(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(split[r].size(), whole.size()) << "rank " << r;
    for (size_t k = 0; k < whole.size(); ++k) {
      // Rank r fills only its half of w; the bias is whole on both.
      const bool mine = k >= kRows * kCols || static_cast<int64_t>(k) / (kRows * kCols / 2) == r;
      if (mine) {
        EXPECT_NEAR(split[r][k], whole[k], 1e-6f * std::abs(whole[k])) << r << " " << k;
      }
    }
  }
}

TEST(ModelParallelNorm, LambAtATensorRankAboveZeroNeedsItsGroup) {
  auto dp = *CreateLoopbackGroup(1, {}, nullptr);
  MemoryTracker tracker;
  auto allocator = MakeCpuCachingAllocator(&tracker);
  ShardManagerOptions o;
  o.optimizer.kind = OptimizerKind::kLamb;
  const auto refused = ShardManager::Create(
      o, {.dp = dp[0].get(), .device_allocator = allocator.get(), .tensor_parallel_rank = 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("Resources::tensor_parallel"), std::string::npos)
      << refused.status();
  // A group given must hold this rank at the index given.
  auto tp = *CreateLoopbackGroup(1, {}, nullptr);
  const auto mismatched = ShardManager::Create(o, {.dp = dp[0].get(),
                                                   .device_allocator = allocator.get(),
                                                   .tensor_parallel_rank = 1,
                                                   .tensor_parallel = tp[0].get()});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("is not this rank's index 0"), std::string::npos)
      << mismatched.status();
}

}  // namespace
}  // namespace zerort
