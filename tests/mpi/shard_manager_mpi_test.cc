// Stage equivalence across processes: the MLP run of the shard-manager tests under mpirun
// (-np 2 and 4), every stage, AdamW and SGD, against the unsharded reference computed on each
// rank. MPI may sum ranks in another order than loopback does, so agreement is to 1e-6
// (norm-wise relative), not bitwise. And offload: every placement against the device run, bitwise.
#include "gtest/gtest.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/sharding/harness.h"
#include "zerort/runtime/mpi_communicator.h"

namespace zerort {
namespace {

using namespace testing;
TEST(ShardManagerMpiTest, EveryStageMatchesTheReference) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World({});
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
      RunConfig c{.stage = stage, .world = world->size(), .optimizer = opt};
      RunResult run;
      ASSERT_TRUE(TrainRank(c, *world, run).ok());
      if (world->rank() != 0) continue;
      const MlpReference ref = Reference(c, nullptr);
      EXPECT_LE(MaxRelativeError(run.params, ref.params), 1e-6)
          << "stage " << static_cast<int>(stage)
          << (opt == OptimizerKind::kSgd ? " SGD" : " AdamW");
    }
  }
}

// Offload under mpirun: optimizer state on the host or NVMe (and stage-3 parameters on NVMe)
// trains bitwise like the device run in the same job (same MPI reduction order in both).
TEST(ShardManagerMpiTest, OffloadedPlacementsEqualTheDeviceRun) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World({});
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
      RunConfig c{.stage = stage, .world = world->size(), .optimizer = opt, .steps = 6};
      RunResult device;
      ASSERT_TRUE(TrainRank(c, *world, device).ok());
      for (MemoryTier tier : {MemoryTier::kPinnedHost, MemoryTier::kNvme}) {
        RunConfig offloaded = c;
        offloaded.placement = {.optimizer = tier,
                               .params = stage == ZeroStage::k3 ? tier : MemoryTier::kDevice};
        offloaded.nvme_path = ::testing::TempDir();
        RunResult run;
        const Status status = TrainRank(offloaded, *world, run);
        ASSERT_TRUE(status.ok()) << status;
        if (world->rank() != 0) continue;
        EXPECT_EQ(run.params, device.params)
            << MemoryTierName(tier) << " stage " << static_cast<int>(stage)
            << (opt == OptimizerKind::kSgd ? " SGD" : " AdamW");
        EXPECT_EQ(run.grad_norms, device.grad_norms);
      }
    }
  }
}

}  // namespace
}  // namespace zerort
