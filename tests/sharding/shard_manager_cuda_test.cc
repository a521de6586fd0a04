// Stage equivalence on CUDA buffers (gpu label): the MLP run with every buffer of the shard
// manager in GPU memory, loopback ranks sharing one GPU, gathers and reductions on the comm
// stream; against the unsharded reference. Skipped with the reason when no GPU is present.
#include "gtest/gtest.h"
#include "tests/sharding/harness.h"

namespace zerort {
namespace {

using namespace testing;

TEST(ShardManagerCudaTest, StagesAndWorldsMatchTheReference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (ZeroStage stage : {ZeroStage::k0, ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
      for (int world : {1, 2, 4}) {
        RunConfig c{.stage = stage, .world = world, .optimizer = opt, .device = Device::Cuda(0)};
        const RunResult run = Train(c);
        ASSERT_EQ(run.error, "");
        EXPECT_LE(MaxRelativeError(run.params, Reference(c, nullptr).params), 1e-6)
            << "stage " << static_cast<int>(stage) << " world " << world;
      }
    }
  }
}

TEST(ShardManagerCudaTest, Bf16ComputeOnTheGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  RunConfig c{.stage = ZeroStage::k3,
              .world = 2,
              .compute = DType::kBF16,
              .steps = 10,
              .device = Device::Cuda(0)};
  const RunResult run = Train(c);
  ASSERT_EQ(run.error, "");
  EXPECT_LE(MaxRelativeError(run.params, Reference(c, nullptr).params), 2e-2);
}

}  // namespace
}  // namespace zerort
