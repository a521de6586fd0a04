// The GPT model trained under mpirun (-np 2 and 4) at ZeRO-3 and ZeRO-1, and with tensor
// parallelism (tp 2: dp x tp = 1 x 2 or 2 x 2, sequence parallelism on and off), gives the losses
// of the same run on one process (a loopback group of one, computed on rank 0) to 1e-5; in fp16
// at tp 2 (MPI reduces 16-bit floats widened to fp32, by their dtype) to fp16's rounding.
#include "gtest/gtest.h"
#include "tests/layers/decoder_harness.h"
#include "tests/mpi/mpi_test_main.h"
#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

struct Layout {
  ZeroStage stage;
  int tp;
  bool sp;
};

// `c` trained under mpirun at each layout gives the losses of `c` on one process (stage 0, tp 1,
// computed on rank 0), each step within `tolerance` of it (relative).
void ExpectSingleProcessLosses(testing::DecoderRunConfig c, const std::vector<Layout>& layouts,
                               double tolerance) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World({});
  std::vector<double> reference;
  if (world->rank() == 0) {
    c.stage = ZeroStage::k0;
    c.tp = 1;
    auto single = *CreateLoopbackGroup(1, {}, nullptr);
    ASSERT_TRUE(testing::TrainDecoderRank(c, *single[0], reference).ok());
  }
  for (const Layout& l : layouts) {
    c.stage = l.stage;
    c.tp = l.tp;
    c.sequence_parallel = l.sp;
    std::vector<double> losses;
    const Status s = testing::TrainDecoderRank(c, *world, losses);
    ASSERT_TRUE(s.ok()) << s;
    if (world->rank() != 0) continue;
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], tolerance * reference[i])
          << DTypeName(c.compute) << " stage " << static_cast<int>(l.stage) << " tp " << l.tp
          << (l.sp ? " sp" : "") << " step " << i;
    }
  }
}

TEST(DecoderMpiTest, ShardedRunsGiveTheSingleProcessLosses) {
  testing::DecoderRunConfig c;
  c.steps = 5;
  ExpectSingleProcessLosses(c,
                            {{ZeroStage::k3, 1, false},
                             {ZeroStage::k1, 1, false},
                             {ZeroStage::k3, 2, false},
                             {ZeroStage::k1, 2, true}},
                            1e-5);
}

// fp16 at tp 2: every rank rounds its partial sums to fp16 before MPI reduces them (widened to
// fp32 by their dtype), so the losses follow the one-process fp16 run to fp16's rounding.
TEST(DecoderMpiTest, Fp16TensorParallelGivesTheSingleProcessLosses) {
  testing::DecoderRunConfig c;
  c.steps = 5;
  c.compute = DType::kF16;
  ExpectSingleProcessLosses(c, {{ZeroStage::k3, 2, false}, {ZeroStage::k3, 2, true}}, 2e-3);
}

}  // namespace
}  // namespace zerort
