// The whole GPT model on CUDA (gpu label; skipped with the reason when no GPU is present):
// forward, backward and ZeRO-3 steps through the shard manager, GPT-2 and LLaMA, against the same
// run on the CPU. The kernels one by one are model_kernels_cuda_test.cc's.
#include <chrono>

#include "gtest/gtest.h"
#include "tests/layers/decoder_harness.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

// The whole model through the shard manager (ZeRO-3, 2 loopback ranks on one GPU) against the
// same run on CPU: the losses of 4 steps.
class WholeModelCudaTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Arch, WholeModelCudaTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

TEST_P(WholeModelCudaTest, TrainsLikeCpu) {
  ZR_NEED_GPU();
  testing::DecoderRunConfig c;
  if (GetParam()) c.model = testing::TinyLlama();
  c.steps = 4;
  auto run = [&](bool cuda, DType dtype) {
    std::vector<double> losses;
    CommOptions options;
    options.timeout = std::chrono::seconds(60);
    const Status status = RunLoopbackRanks(2, options, nullptr, [&](Communicator& comm) -> Status {
      MemoryTracker tracker;
      std::unique_ptr<Allocator> allocator;
      std::unique_ptr<Stream> stream;
      if (cuda) {
        ZR_RETURN_IF_ERROR(SetCurrentDevice(Device::Cuda(0)));
        ZR_ASSIGN_OR_RETURN(allocator, MakeCudaCachingAllocator(Device::Cuda(0), &tracker));
      } else {
        allocator = MakeCpuCachingAllocator(&tracker);
      }
      ShardManagerOptions o;
      o.stage = ZeroStage::k3;
      o.compute_dtype = dtype;
      o.reduce_dtype = DType::kF32;
      o.stage3_param_persistence_threshold = 0;
      ZR_ASSIGN_OR_RETURN(auto manager, ShardManager::Create(
                                            o, {.dp = &comm, .device_allocator = allocator.get()}));
      auto store = MakeShardManagerStore(*manager);
      std::unique_ptr<ModelKernels> kernels;
      if (cuda) {
        ZR_ASSIGN_OR_RETURN(kernels, MakeCudaModelKernels(dtype, DType::kF32,
                                                          manager->compute_stream(), *allocator));
      } else {
        kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
      }
      const int per_rank = c.global_batch / 2;
      ZR_ASSIGN_OR_RETURN(auto model,
                          DecoderModel::Create({.config = c.model, .micro_batch = per_rank}, *store,
                                               *kernels, *allocator));
      ZR_RETURN_IF_ERROR(manager->Initialize(DecoderInitializer(c.model)));
      std::vector<int32_t> tokens, targets;
      for (int step = 0; step < c.steps; ++step) {
        testing::TestBatch(int64_t{step} * c.global_batch + comm.rank() * per_rank, per_rank,
                           c.model.seq_len, c.model.vocab_size, tokens, targets);
        ZR_ASSIGN_OR_RETURN(
            double loss, model->ForwardBackward(tokens, targets, per_rank, c.model.seq_len, 1.0f));
        ZR_RETURN_IF_ERROR(manager->Step({.lr = c.lr}).status());
        if (comm.rank() == 0) losses.push_back(loss);
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    return losses;
  };
  const std::vector<double> cpu = run(false, DType::kF32);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<double> gpu = run(true, dtype);
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_NEAR(gpu[i], cpu[i], (dtype == DType::kF32 ? 1e-5 : 2e-2) * cpu[i])
          << DTypeName(dtype) << " step " << i;
    }
  }
}

}  // namespace
}  // namespace zerort
