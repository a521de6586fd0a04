// The memory model's own arithmetic, without a training run: the ZeRO paper's model-state example,
// cold mode against the config mode, the terms' names, the attention programs' saved tensors and
// scratch, the host step's prefetch, and input validation. The estimate against measured steps is
// memory_grid_test.cc.
#include "zerort/estimate/memory_model.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// Rajbhandari et al. 2020, figure 1: 7.5B parameters, N = 64, K = 12.
TEST(MemoryModelTest, ZeroPaperModelStates) {
  const double psi = 7.5e9;
  EXPECT_NEAR(ZeroPaperModelStates(psi, 64, 0) / 1e9, 120.0, 0.05);
  EXPECT_NEAR(ZeroPaperModelStates(psi, 64, 1) / 1e9, 31.4, 0.05);
  EXPECT_NEAR(ZeroPaperModelStates(psi, 64, 2) / 1e9, 16.6, 0.05);
  EXPECT_NEAR(ZeroPaperModelStates(psi, 64, 3) / 1e9, 1.9, 0.05);
}

// Cold mode (--params P --largest-layer-params L) describes zerort's runtime: on GPT shapes of
// the same P and L its parameters + gradients + optimizer state + gathered weights are within 5%
// of the config mode's (the GPT-2 XL example: 5.84 and 8.06 GiB at stages 3 and 2 on 8
// GPUs, where the ZeRO paper's 2 + 2 + 12 bytes gave 3.20 and 5.44).
TEST(MemoryModelTest, ColdModeAgreesWithTheConfigModeOnGptShapes) {
  struct Shape {
    const char* name;
    DecoderConfig model;
    int gpus;
  };
  const Shape shapes[] = {
      {"gpt2", *DecoderPreset("gpt2"), 8},
      {"gpt2-xl", *DecoderPreset("gpt2-xl"), 8},
      {"70B",
       DecoderConfig{
           .n_layer = 86, .n_head = 64, .d_model = 8192, .seq_len = 2048, .vocab_size = 50257},
       64}};
  using C = MemoryCategory;
  auto states = [](const MemoryEstimate& e) {
    int64_t sum = 0;
    for (C c : {C::kParameters, C::kGradients, C::kOptimizerState, C::kGatheredWeights}) {
      sum += e.Peak(MemoryTier::kDevice, c);
    }
    return static_cast<double>(sum);
  };
  for (const Shape& shape : shapes) {
    int64_t largest = 0;
    const std::vector<DecoderUnit> units = *DecoderUnits(shape.model, 1, 0);
    for (const DecoderUnit& u : units) {
      int64_t n = 0;
      for (const ParamSpec& p : u.params) n += p.numel();
      largest = std::max(largest, n);
    }
    const int64_t params = shape.model.NumParameters();
    const ColdDecoder fit = *FitColdDecoder(params, largest);
    EXPECT_EQ(fit.d, shape.model.d_model) << shape.name;
    int64_t total = 0, biggest = 0;
    for (int64_t u : fit.units) {
      total += u;
      biggest = std::max(biggest, u);
    }
    EXPECT_EQ(total, params) << shape.name;
    EXPECT_EQ(biggest, largest) << shape.name;
    for (int stage : {2, 3}) {
      MemoryModelInput in;
      in.model = shape.model;
      in.dp = shape.gpus;
      in.manager.stage = static_cast<ZeroStage>(stage);
      in.manager.compute_dtype = DType::kBF16;
      in.cuda = true;
      const MemoryEstimate config = *EstimateMemory(in);
      const MemoryEstimate cold = *EstimateColdModelStates(in, params, largest);
      const std::string what = StrCat(shape.name, " stage ", stage);
      EXPECT_NEAR(states(cold), states(config), 0.05 * states(config)) << what;
      // What is exact: the persistent buffers of UnitPlan, and nothing of the shape.
      EXPECT_EQ(cold.Peak(MemoryTier::kDevice, C::kOptimizerState),
                config.Peak(MemoryTier::kDevice, C::kOptimizerState))
          << what;
      EXPECT_EQ(cold.Peak(MemoryTier::kDevice, C::kActivations), 0) << what;
      EXPECT_EQ(cold.Peak(MemoryTier::kDevice, C::kWorkspace), 0) << what;
      // The paper's figure is below what zerort's runtime keeps (fp32 gradient shards and
      // reduction buffers).
      EXPECT_LT(ZeroPaperModelStates(static_cast<double>(params), shape.gpus, stage), states(cold))
          << what;
      std::printf(
          "%s: config %.3f GiB, cold %.3f GiB, paper %.3f GiB\n", what.c_str(),
          states(config) / 1073741824.0, states(cold) / 1073741824.0,
          ZeroPaperModelStates(static_cast<double>(params), shape.gpus, stage) / 1073741824.0);
    }
  }
  EXPECT_FALSE(FitColdDecoder(100, 101).ok());
  EXPECT_FALSE(FitColdDecoder(int64_t{1} << 50, 1000).ok());  // more than 4096 units
  const ColdDecoder one = *FitColdDecoder(1000, 1000);        // one layer
  EXPECT_EQ(one.units, std::vector<int64_t>{1000});
  // The extremes the CLI takes (--params up to 1e15): no overflow, every unit at most L.
  for (const auto& [params, largest] : std::vector<std::pair<int64_t, int64_t>>{
           {int64_t{1'000'000'000'000'000}, int64_t{1'000'000'000'000'000}},
           {int64_t{1'000'000'000'000'000}, int64_t{400'000'000'000}},
           {100, 1},
           {100, 30}}) {
    const StatusOr<ColdDecoder> d = FitColdDecoder(params, largest);
    ASSERT_TRUE(d.ok()) << params << " " << largest << ": " << d.status();
    int64_t sum = 0;
    for (int64_t u : d->units) {
      EXPECT_GE(u, 1) << params << " " << largest;
      EXPECT_LE(u, largest) << params << " " << largest;
      sum += u;
    }
    EXPECT_EQ(sum, params) << params << " " << largest;
    EXPECT_GE(d->d, 1);
  }
}

TEST(MemoryModelTest, ShardingDividesModelStates) {
  MemoryModelInput in;
  in.model = *DecoderPreset("gpt2");
  in.micro_batch = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    in.manager.stage = static_cast<ZeroStage>(stage);
    in.dp = 8;
    const MemoryEstimate e = *EstimateMemory(in);
    const int64_t optim = e.Peak(MemoryTier::kDevice, MemoryCategory::kOptimizerState);
    const double full = 2.0 * 4 * in.model.NumParameters();
    EXPECT_NEAR(optim, stage == 0 ? full : full / 8, 0.01 * full) << "stage " << stage;
  }
  in.manager.placement.optimizer = MemoryTier::kPinnedHost;
  const MemoryEstimate e = *EstimateMemory(in);
  EXPECT_EQ(e.Peak(MemoryTier::kDevice, MemoryCategory::kOptimizerState), 0);
  EXPECT_GT(e.Peak(MemoryTier::kPinnedHost, MemoryCategory::kOptimizerState), 0);
}

// The model-state terms say which kinds of buffer, each once, and how many units hold them: a
// 4,096-block model's parameters are "master, compute shard (4098 units)", not the two names
// 4,098 times (what `estimate --explain` and the memory refusal print).
TEST(MemoryModelTest, TheModelStateTermsNameEachBufferOnce) {
  MemoryModelInput in;
  in.model = *DecoderPreset("tiny");
  in.model.n_layer = 4096;
  in.micro_batch = 1;
  in.manager.stage = ZeroStage::k3;
  const MemoryEstimate e = *EstimateMemory(in);
  std::map<MemoryCategory, std::string> what;
  for (const MemoryTerm& t : e.terms) {
    if (t.formula.starts_with("sum over units")) what[t.category] = t.what;
  }
  const int64_t units = in.model.n_layer + 2;  // the blocks, the embedding, the final norm
  EXPECT_EQ(what[MemoryCategory::kParameters], StrCat("master, compute shard (", units, " units)"));
  EXPECT_EQ(what[MemoryCategory::kGradients], StrCat("gradient shard (", units, " units)"));
  EXPECT_EQ(what[MemoryCategory::kOptimizerState],
            StrCat("exp_avg, exp_avg_sq (", units, " units)"));
}

// GPT-2 124M at ZeRO-3 in bf16 on one GPU, `micro_batch` sequences of 1024.
MemoryModelInput Gpt2Bf16Zero3OnCuda(int micro_batch) {
  MemoryModelInput in;
  in.model = *DecoderPreset("gpt2");
  in.micro_batch = micro_batch;
  in.manager.stage = ZeroStage::k3;
  in.manager.compute_dtype = DType::kBF16;
  in.cuda = true;
  return in;
}

// The attention program on CUDA (kernels/memory_facts.h, model.attention_backend): GPT-2 at 8 x
// 1024 in bf16 saves a log-sum-exp per query under flash (auto: head size 64) instead of the
// B x H x T x T probabilities, 12 blocks x 8 x 12 x 1024 x (1024 x 2 - 4) bytes less; a flash
// request the kernels cannot take (fp32) is refused by name; the CPU runs flash whatever is asked.
TEST(MemoryModelTest, TheAttentionProgramSizesTheSavedTensor) {
  MemoryModelInput in = Gpt2Bf16Zero3OnCuda(8);
  auto activations = [&](std::optional<AttentionProgram> attention) {
    in.attention = attention;
    return EstimateMemory(in)->Peak(MemoryTier::kDevice, MemoryCategory::kActivations);
  };
  const int64_t automatic = activations(std::nullopt);
  EXPECT_EQ(activations(AttentionProgram::kFlash), automatic);
  const int64_t per_block = int64_t{8} * 12 * 1024 * (1024 * 2 - 4);
  EXPECT_EQ(activations(AttentionProgram::kMaterialised) - automatic, 12 * per_block);
  in.manager.compute_dtype = DType::kF32;
  in.attention = AttentionProgram::kFlash;
  const Status fp32 = EstimateMemory(in).status();
  EXPECT_NE(fp32.message().find("model.attention_backend = \"flash\": flash attention on CUDA "
                                "takes bf16 or fp16, not f32"),
            std::string::npos)
      << fp32;
  in.cuda = false;
  const int64_t cpu_flash = activations(AttentionProgram::kFlash);
  EXPECT_EQ(activations(AttentionProgram::kMaterialised), cpu_flash);
}

// model.flash_attention (the flash kernels' block shapes) splits the same work: every byte is the
// same whatever they are; one the head size does not take is refused by name, as a run refuses it.
TEST(MemoryModelTest, TheFlashBlockShapesChangeNoByte) {
  MemoryModelInput in = Gpt2Bf16Zero3OnCuda(8);
  const MemoryEstimate plain = *EstimateMemory(in);
  in.flash_tiles = {128, 128, 32};
  const MemoryEstimate tiled = *EstimateMemory(in);
  for (MemoryCategory c : {MemoryCategory::kActivations, MemoryCategory::kWorkspace}) {
    EXPECT_EQ(tiled.Peak(MemoryTier::kDevice, c), plain.Peak(MemoryTier::kDevice, c));
  }
  EXPECT_EQ(tiled.PeakTotal(MemoryTier::kDevice), plain.PeakTotal(MemoryTier::kDevice));
  in.model.n_head = 6;  // head size 128
  const Status hs128 = EstimateMemory(in).status();
  EXPECT_NE(hs128.message().find("model.flash_attention.backward_block_keys = 128 at head size "
                                 "128"),
            std::string::npos)
      << hs128;
}

// cuDNN's attention saves what zerort's flash saves (the log-sum-exps), and its workspaces are
// the budgets kernels/memory_facts.h gives it (1 MiB forward; the flash backward's, the sequence
// rounded up to 128, its dQ part twice with grouped heads, plus 1 MiB): the same activations, the
// workspace's peak the larger budget.
TEST(MemoryModelTest, TheCudnnAttentionSavesWhatFlashSaves) {
  MemoryModelInput in = Gpt2Bf16Zero3OnCuda(8);
  in.attention = AttentionProgram::kFlash;
  const MemoryEstimate flash = *EstimateMemory(in);
  in.attention = AttentionProgram::kCudnn;
  const MemoryEstimate cudnn = *EstimateMemory(in);
  EXPECT_EQ(cudnn.Peak(MemoryTier::kDevice, MemoryCategory::kActivations),
            flash.Peak(MemoryTier::kDevice, MemoryCategory::kActivations));
  // GPT-2 at 8 x 1024: 12 heads, d 768; the sequence is already a multiple of 128.
  const int64_t flash_ws = (int64_t{8} * 12 * 1024 + int64_t{8} * 1024 * 768) * 4;
  EXPECT_EQ(cudnn.Peak(MemoryTier::kDevice, MemoryCategory::kWorkspace) -
                flash.Peak(MemoryTier::kDevice, MemoryCategory::kWorkspace),
            kCudnnForwardWorkspaceBytes);
  EXPECT_EQ(AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kCudnn, true, 8, 1024,
                                  768, 12, 12, 2),
            std::vector<int64_t>{flash_ws + kCudnnForwardWorkspaceBytes});
  EXPECT_EQ(AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kCudnn, true, 1, 100, 128,
                                  2, 2, 2),
            std::vector<int64_t>{(2 * 128 + 128 * 128) * 4 + kCudnnForwardWorkspaceBytes});
  // Grouped heads (LLaMA 3.2 1B at 4 x 2048: 32 query heads on 8): cuDNN 9 asked an H200 for
  // 135,266,560 bytes, 67,108,864 more than the ungrouped budget.
  const std::vector<int64_t> grouped = AttentionScratchBytes(
      KernelBackend::kCuda, AttentionProgram::kCudnn, true, 4, 2048, 2048, 32, 8, 2);
  EXPECT_EQ(grouped, std::vector<int64_t>{(4 * 32 * 2048 + 2 * 4 * 2048 * 2048) * 4 +
                                          kCudnnForwardWorkspaceBytes});
  EXPECT_GE(grouped[0], 135266560);
  EXPECT_TRUE(AttentionScratchBytes(KernelBackend::kCpu, AttentionProgram::kCudnn, true, 1, 100,
                                    128, 2, 2, 2)
                  .empty());
}

// [Note: the host step behind the forward]: on a GPU with the optimizer on the host, the forward
// after a deferred step prefetches at most one unit beyond those completed, so the replayed
// forward holds fewer gathered weights than the same run with the overlap off (DeepSpeed's
// default prefetch bucket, 5e7 elements, would gather the embedding and seven GPT-2 blocks at
// the first use); the backward's prefetch is the same either way.
TEST(MemoryModelTest, TheHostStepBehindTheForwardNarrowsItsPrefetch) {
  MemoryModelInput in = Gpt2Bf16Zero3OnCuda(1);
  in.manager.stage3_param_persistence_threshold = 0;
  in.manager.placement.optimizer = MemoryTier::kPinnedHost;
  in.dp = 2;  // one shard rank would gather nothing ([Note: one shard rank])
  const MemoryEstimate overlapped = *EstimateMemory(in);
  in.manager.overlap_host_step = HostStepOverlap::kOff;
  const MemoryEstimate serial = *EstimateMemory(in);
  const int64_t block = int64_t{12} * 768 * 768 * 2;  // a GPT-2 block's weights in bf16, about
  EXPECT_LT(overlapped.phase_forward[0], serial.phase_forward[0] - 4 * block)
      << overlapped.phase_forward[0] << " against " << serial.phase_forward[0];
  EXPECT_EQ(overlapped.phase_backward[0], serial.phase_backward[0]);
  in.cuda = false;  // kAuto: not on the synchronous CPU device
  in.manager.overlap_host_step = HostStepOverlap::kAuto;
  const MemoryEstimate cpu = *EstimateMemory(in);
  in.manager.overlap_host_step = HostStepOverlap::kOff;
  EXPECT_EQ(cpu.phase_forward[0], EstimateMemory(in)->phase_forward[0]);
}

// [Note: one shard rank]: ZeRO-3 on one GPU reads its compute shards in place, so the estimate
// holds no gathered weights (GPT-2 124M in bf16: its tied embedding alone is 50257 x 768 x 2
// bytes when gathered); two ranks, or shards offloaded to the host, gather as ever.
TEST(MemoryModelTest, OneShardRankHoldsNoGatheredWeights) {
  MemoryModelInput in = Gpt2Bf16Zero3OnCuda(1);
  const MemoryEstimate one = *EstimateMemory(in);
  EXPECT_EQ(one.Peak(MemoryTier::kDevice, MemoryCategory::kGatheredWeights), 0);
  in.dp = 2;
  const MemoryEstimate two = *EstimateMemory(in);
  EXPECT_GT(two.Peak(MemoryTier::kDevice, MemoryCategory::kGatheredWeights),
            int64_t{50257} * 768 * 2);
  in.dp = 1;
  in.manager.placement.params = MemoryTier::kPinnedHost;  // offloaded shards are copied in
  EXPECT_GT(EstimateMemory(in)->Peak(MemoryTier::kDevice, MemoryCategory::kGatheredWeights), 0);
}

TEST(MemoryModelTest, InvalidInputIsRefused) {
  MemoryModelInput in;
  in.model = *DecoderPreset("gpt2");
  in.dp = 0;
  EXPECT_NE(EstimateMemory(in).status().message().find("data-parallel size = 0"),
            std::string::npos);
  in.dp = 1;
  in.tp = 5;
  EXPECT_NE(EstimateMemory(in).status().message().find("does not divide"), std::string::npos);
  in.tp = 1;
  in.head_chunk_rows = -1;
  EXPECT_NE(EstimateMemory(in).status().message().find("model.head_chunk_rows = -1"),
            std::string::npos);
  in.head_chunk_rows = 0;
  in.model.n_head = 7;
  EXPECT_NE(EstimateMemory(in).status().message().find("does not divide"), std::string::npos);
}

}  // namespace
}  // namespace zerort
