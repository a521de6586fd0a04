// The GPT model trained under mpirun (-np 2 and 4) at ZeRO-3 and ZeRO-1 gives the losses of the
// same run on one process (a loopback group of one, computed on rank 0) to 1e-5.
#include "gtest/gtest.h"
#include "runtime/loopback_communicator.h"
#include "tests/layers/gpt_harness.h"
#include "tests/mpi/mpi_test_main.h"

namespace zerort {
namespace {

TEST(GptMpiTest, ShardedRunsGiveTheSingleProcessLosses) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World({});
  testing::GptRunConfig c;
  c.steps = 5;
  std::vector<double> reference;
  if (world->rank() == 0) {
    c.stage = ZeroStage::k0;
    auto single = *CreateLoopbackGroup(1, {}, nullptr);
    ASSERT_TRUE(testing::TrainGptRank(c, *single[0], reference).ok());
  }
  for (ZeroStage stage : {ZeroStage::k3, ZeroStage::k1}) {
    c.stage = stage;
    std::vector<double> losses;
    ASSERT_TRUE(testing::TrainGptRank(c, *world, losses).ok());
    if (world->rank() != 0) continue;
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i])
          << "stage " << static_cast<int>(stage) << " step " << i;
    }
  }
}

}  // namespace
}  // namespace zerort
