// Stage equivalence across processes: the MLP run of the shard-manager tests under mpirun
// (-np 2 and 4), every stage, AdamW and SGD, against the unsharded reference computed on each
// rank. MPI may sum ranks in another order than loopback does, so agreement is to 1e-6
// (norm-wise relative), not bitwise.
#include "gtest/gtest.h"
#include "runtime/log.h"
#include "runtime/mpi_communicator.h"
#include "tests/sharding/harness.h"

namespace zerort {
namespace {

using namespace testing;
MpiContext* g_mpi = nullptr;

TEST(ShardManagerMpiTest, EveryStageMatchesTheReference) {
  std::unique_ptr<Communicator> world = *g_mpi->World({});
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
      RunConfig c{.stage = stage, .world = world->size(), .optimizer = opt};
      RunResult run;
      ASSERT_TRUE(TrainRank(c, *world, run).ok());
      if (world->rank() != 0) continue;
      const MlpReference ref = Reference(c, nullptr);
      EXPECT_LE(MaxRelativeError(run.params, ref.params), 1e-6)
          << "stage " << static_cast<int>(stage) << (opt == OptimizerKind::kSgd ? " SGD" : " AdamW");
    }
  }
}

}  // namespace
}  // namespace zerort

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto mpi = zerort::MpiContext::Init(&argc, &argv, {});
  if (!mpi.ok()) return 1;
  zerort::ConfigureLogging({(*mpi)->world_rank(), (*mpi)->world_size()});
  zerort::g_mpi = mpi->get();
  if ((*mpi)->world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  mpi->reset();
  return rc;
}
