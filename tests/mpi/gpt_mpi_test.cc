// The GPT model trained under mpirun (-np 2 and 4) at ZeRO-3 and ZeRO-1, and with tensor
// parallelism (tp 2: dp x tp = 1 x 2 or 2 x 2, sequence parallelism on and off), gives the losses
// of the same run on one process (a loopback group of one, computed on rank 0) to 1e-5; in fp16
// at tp 2 (MPI reduces 16-bit floats widened to fp32, by their dtype) to fp16's rounding.
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
    c.tp = 1;
    auto single = *CreateLoopbackGroup(1, {}, nullptr);
    ASSERT_TRUE(testing::TrainGptRank(c, *single[0], reference).ok());
  }
  struct Layout {
    ZeroStage stage;
    int tp;
    bool sp;
  };
  for (Layout l : {Layout{ZeroStage::k3, 1, false}, Layout{ZeroStage::k1, 1, false},
                   Layout{ZeroStage::k3, 2, false}, Layout{ZeroStage::k1, 2, true}}) {
    c.stage = l.stage;
    c.tp = l.tp;
    c.sequence_parallel = l.sp;
    std::vector<double> losses;
    const Status s = testing::TrainGptRank(c, *world, losses);
    ASSERT_TRUE(s.ok()) << s;
    if (world->rank() != 0) continue;
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i])
          << "stage " << static_cast<int>(l.stage) << " tp " << l.tp << (l.sp ? " sp" : "")
          << " step " << i;
    }
  }
}

TEST(GptMpiTest, Fp16TensorParallelGivesTheSingleProcessLosses) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World({});
  testing::GptRunConfig c;
  c.steps = 5;
  c.compute = DType::kF16;
  std::vector<double> reference;
  if (world->rank() == 0) {
    c.stage = ZeroStage::k0;
    auto single = *CreateLoopbackGroup(1, {}, nullptr);
    ASSERT_TRUE(testing::TrainGptRank(c, *single[0], reference).ok());
  }
  c.tp = 2;
  c.stage = ZeroStage::k3;
  for (bool sp : {false, true}) {
    c.sequence_parallel = sp;
    std::vector<double> losses;
    const Status s = testing::TrainGptRank(c, *world, losses);
    ASSERT_TRUE(s.ok()) << s;
    if (world->rank() != 0) continue;
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 2e-3 * reference[i])
          << "fp16 tp 2" << (sp ? " sp" : "") << " step " << i;
    }
  }
}

}  // namespace
}  // namespace zerort
