// Step agreement with tensor parallelism: two tensor-parallel ranks (each its own data-parallel
// group) hold halves of a split weight and each a copy of a replicated bias. The gradient norm
// both report is the whole model's (split halves summed over the model-parallel group, the
// replicated bias counted once, on tensor-parallel rank 0), on the device, host and NVMe tiers;
// a NaN on one rank makes both skip the step.
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

}  // namespace
}  // namespace zerort
