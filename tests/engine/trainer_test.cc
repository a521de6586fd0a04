// The training engine: LR schedules against DeepSpeed's formulas, token files (round trip and each
// corruption named), the data loader's determinism, and whole training runs on loopback ranks:
// stage 0 on one rank and stage 3 on four give the same loss curve in metrics.jsonl.
#include "zerort/engine/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/engine/metrics_file.h"
#include "zerort/data/data_loader.h"
#include "zerort/data/token_file.h"
#include "zerort/engine/lr_schedule.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

TEST(LrScheduleTest, DeepSpeedFormulas) {
  OptimizerConfig opt;
  opt.lr = 0.5f;
  SchedulerConfig s;
  EXPECT_DOUBLE_EQ(LearningRate(opt, s, 123), 0.5f);  // no scheduler: the optimizer's lr
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0f;
  s.warmup_max_lr = 1.0f;
  s.warmup_num_steps = 100;
  s.warmup_type = "log";
  EXPECT_DOUBLE_EQ(LearningRate(opt, s, 0), 0.0);
  EXPECT_NEAR(LearningRate(opt, s, 9), std::log(10.0) / std::log(100.0), 1e-7);
  EXPECT_DOUBLE_EQ(LearningRate(opt, s, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(opt, s, 5000), 1.0);
  s.warmup_type = "linear";
  EXPECT_NEAR(LearningRate(opt, s, 25), 0.25, 1e-7);
  s.type = "WarmupDecayLR";
  s.total_num_steps = 300;
  EXPECT_NEAR(LearningRate(opt, s, 100), 1.0, 1e-7);
  EXPECT_NEAR(LearningRate(opt, s, 200), 0.5, 1e-7);
  EXPECT_NEAR(LearningRate(opt, s, 300), 0.0, 1e-7);
  EXPECT_NEAR(LearningRate(opt, s, 400), 0.0, 1e-7);
  s.type = "WarmupCosineLR";
  s.warmup_min_ratio = 0.1f;
  s.cos_min_ratio = 0.01f;
  EXPECT_NEAR(LearningRate(opt, s, 0), 0.5 * 0.1, 1e-7);
  EXPECT_NEAR(LearningRate(opt, s, 50), 0.5 * (0.1 + 0.9 * 0.5), 1e-7);
  // real_last_step = it - warmup + 1 of real_total = 200: half way at it = 199.
  EXPECT_NEAR(LearningRate(opt, s, 199), 0.5 * (0.01 + 0.99 * 0.5), 1e-6);
  EXPECT_NEAR(LearningRate(opt, s, 299), 0.5 * 0.01, 1e-7);
}

TEST(TokenFileTest, RoundTripAndEveryCorruptionNamed) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/tokens.bin";
  const std::vector<int32_t> bytes = ByteTokens("hello, tokens\n");
  ASSERT_TRUE(WriteTokenFile(path, bytes, 256).ok());
  TokenFile f = *ReadTokenFile(path);
  EXPECT_EQ(f.tokens, bytes);
  EXPECT_EQ(f.width, 1);
  const std::vector<int32_t> wide = {0, 300, 65535, 7};
  ASSERT_TRUE(WriteTokenFile(path, wide, 70000).ok());
  f = *ReadTokenFile(path);
  EXPECT_EQ(f.tokens, wide);
  EXPECT_EQ(f.width, 4);
  EXPECT_FALSE(WriteTokenFile(path, {256}, 256).ok());

  std::string raw;
  {
    std::ifstream in(path, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto corrupt = [&](std::string data, const char* needle) {
    const std::string bad = dir + "/bad.bin";
    std::ofstream(bad, std::ios::binary) << data;
    const Status s = ReadTokenFile(bad).status();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
    EXPECT_NE(s.message().find(bad), std::string::npos) << "names the file: " << s;
  };
  corrupt(raw.substr(0, 20), "shorter than the 32-byte");
  corrupt("X" + raw.substr(1), "no zerort, llm.c or Megatron header");
  corrupt(raw.substr(0, raw.size() - 1), "holds 15 bytes");
  std::string big = raw;
  big[32 + 4] = '\x7f';  // token 1 = 0x7f.. beyond the vocabulary
  big[32 + 7] = '\x7f';
  corrupt(big, "outside the vocabulary");
  std::string version = raw;
  version[8] = 9;
  corrupt(version, "version 9");
}

TEST(DataLoaderTest, WindowsAreDeterministicAndSplit) {
  std::vector<int32_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = i % 251;
  auto source = [](std::vector<int32_t> t) -> std::shared_ptr<const TokenSource> {
    return TokenSource::FromTokens(std::move(t), 256, "test");
  };
  const DataLoader d = *DataLoader::Create(source(tokens), 16, 0.1, 256);
  EXPECT_EQ(d.train_tokens(), 900);
  EXPECT_EQ(d.validation_windows(), 100 / 17);
  std::vector<int32_t> in(16), out(16);
  ASSERT_TRUE(d.TrainSequence(3, in, out).ok());
  EXPECT_EQ(in[0], 48);
  EXPECT_EQ(out[0], 49);
  EXPECT_EQ(out[15], 64);
  ASSERT_TRUE(d.ValidationWindow(1, in, out).ok());
  EXPECT_EQ(in[0], (900 + 17) % 251);
  EXPECT_FALSE(DataLoader::Create(source(std::vector<int32_t>(10, 1)), 16, 0.0, 256).ok());
  EXPECT_NE(DataLoader::Create(source(tokens), 16, 0.01, 256).status().message().find("no window"),
            std::string::npos);
  // A token beyond the model's vocabulary fails the window that holds it, by index.
  const DataLoader small = *DataLoader::Create(source(tokens), 16, 0.1, 200);
  const Status s = small.TrainSequence(12, in, out);  // tokens 192..208: 200 is the first bad
  EXPECT_NE(s.message().find("token 200 = 200 is outside the vocabulary [0, 200)"),
            std::string::npos)
      << s;
}

// [Note: blending token files]: a blend of two files weighted 1:3 gives each its share of every
// prefix of the sequences (to within 2), reads each file's sequences in its own order, finds any
// sequence without walking from 0 (across a block boundary too), and takes the files in turn for
// validation; weights too small to have a sequence per block are refused.
TEST(DataLoaderTest, BlendFollowsTheWeightsAndReadsEachFileInOrder) {
  auto source = [](int base) -> std::shared_ptr<const TokenSource> {
    std::vector<int32_t> t(2000);
    for (int i = 0; i < 2000; ++i) t[i] = base + i % 50;
    return TokenSource::FromTokens(std::move(t), 256, base == 0 ? "a" : "b");
  };
  const DataLoader d = *DataLoader::CreateBlend({source(0), source(100)}, {1.0, 3.0}, 16, 0.1, 256);
  EXPECT_EQ(d.source(), "blend of 2: 0.25 a, 0.75 b");
  ASSERT_NE(d.blend(), nullptr);
  const BlendIndex& blend = *d.blend();
  std::vector<int64_t> count(2, 0);
  std::vector<int32_t> in(16), out(16);
  for (int64_t g = 0; g < 3000; ++g) {
    const auto [part, k] = blend.At(g);
    ASSERT_EQ(k, count[part]) << "sequence " << g << ": file " << part << " out of order";
    ++count[part];
    EXPECT_LE(std::abs(static_cast<double>(count[0]) - 0.25 * static_cast<double>(g + 1)), 2.0)
        << g;
    if (g % 97 == 0) {
      ASSERT_TRUE(d.TrainSequence(g, in, out).ok());
      EXPECT_EQ(in[0] >= 100, part == 1) << "sequence " << g << " read from the other file";
    }
  }
  EXPECT_EQ(blend.CountsBefore(3000), count);
  // Random access: another index, asked out of order and across block boundaries.
  const BlendIndex fresh = *BlendIndex::Create({1.0, 3.0});
  const int64_t far = 5 * BlendIndex::kBlock + 17;
  std::vector<int64_t> tally = fresh.CountsBefore(far - 40);
  for (int64_t g = far - 40; g < far; ++g) {
    const auto [part, k] = fresh.At(g);
    EXPECT_EQ(k, tally[part]) << g;
    ++tally[part];
  }
  EXPECT_EQ(tally, fresh.CountsBefore(far));
  EXPECT_NEAR(static_cast<double>(tally[1]), 0.75 * static_cast<double>(far), 2.0);
  EXPECT_EQ(fresh.At(5), blend.At(5));
  // Validation: each file in turn.
  EXPECT_EQ(d.validation_windows(), 2 * (200 / 17));
  ASSERT_TRUE(d.ValidationWindow(0, in, out).ok());
  EXPECT_LT(in[0], 100);
  ASSERT_TRUE(d.ValidationWindow(1, in, out).ok());
  EXPECT_GE(in[0], 100);
  // A weight below 2 / kBlock of the total is refused, naming the file.
  const StatusOr<BlendIndex> tiny = BlendIndex::Create({1.0, 1e-6});
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("file 1"), std::string::npos) << tiny.status();
  EXPECT_FALSE(BlendIndex::Create({1.0, -1.0}).ok());
  EXPECT_FALSE(DataLoader::CreateBlend({source(0)}, {1.0, 2.0}, 16, 0.1, 256).ok());
}

RunConfig SmallRun(const std::string& metrics) {
  RunConfig c = *ParseRunConfig(nlohmann::json::parse(R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3, "warmup_max_lr": 3e-3,
                                                  "warmup_type": "linear"}},
    "gradient_clipping": 1.0, "steps_per_print": 100,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
    "train": {"steps": 8, "eval_windows": 4, "sample_tokens": 0, "device": "cpu"}
  })"),
                                "test");
  c.logging.metrics_file = metrics;
  return c;
}

std::vector<double> TrainOn(int world, int stage, int accumulation_per_rank,
                            const std::string& name) {
  const std::string metrics = ::testing::TempDir() + "/" + name + ".jsonl";
  std::filesystem::remove(metrics);
  RunConfig c = SmallRun(metrics);
  c.zero.stage = stage;
  c.manager.stage3_param_persistence_threshold = 0;
  c.train_micro_batch_size_per_gpu = 8 / world / accumulation_per_rank;
  std::FILE* sink = std::fopen("/dev/null", "w");
  CommOptions options;
  options.timeout = std::chrono::seconds(120);
  const Status status = RunLoopbackRanks(world, options, nullptr, [&](Communicator& comm) {
    return Train(c, {.world = &comm, .world_source = "test", .out = sink}).status();
  });
  std::fclose(sink);
  EXPECT_TRUE(status.ok()) << status;
  return testing::MetricLosses(metrics);
}

TEST(TrainerTest, Stage3OnFourRanksFollowsStage0OnOne) {
  const std::vector<double> reference = TrainOn(1, 0, 1, "w1s0");
  ASSERT_EQ(reference.size(), 8u);
  EXPECT_LT(reference.back(), reference.front() - 0.3) << "the loss did not fall";
  const std::vector<double> sharded = TrainOn(4, 3, 1, "w4s3");
  const std::vector<double> accumulated = TrainOn(2, 2, 2, "w2s2acc2");
  ASSERT_EQ(sharded.size(), reference.size());
  ASSERT_EQ(accumulated.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_NEAR(sharded[i], reference[i], 1e-5 * reference[i]) << "step " << i + 1;
    EXPECT_NEAR(accumulated[i], reference[i], 1e-5 * reference[i]) << "step " << i + 1;
  }
}

// data.eod_mask_loss (Megatron's): the positions whose input is the end-of-text token add no
// loss; at tp 2 (the vocabulary-parallel cross-entropy, masked rows on every rank) the losses
// are one rank's; without the mask they differ; without an end-of-text token it is refused.
TEST(TrainerTest, EodMaskLossAtTp2EqualsOneRank) {
  const std::string dir = ::testing::TempDir() + "/eod_mask";
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens(6000);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = i % 37 == 36 ? 255 : static_cast<int32_t>((i * 7 + i / 11) % 200);
  }
  ASSERT_TRUE(WriteTokenFile(dir + "/tokens.bin", tokens, 256).ok());
  auto run = [&](int world, int tp, bool mask,
                 const std::string& name) -> StatusOr<std::vector<double>> {
    const std::string metrics = dir + "/" + name + ".jsonl";
    std::filesystem::remove(metrics);
    RunConfig c = SmallRun(metrics);
    c.data.path = dir + "/tokens.bin";
    c.data.eod_mask_loss = mask;
    c.data.eos_token_id = mask ? 255 : -1;
    c.parallel.tensor_parallel_size = tp;
    c.train_micro_batch_size_per_gpu = 4;
    std::FILE* sink = std::fopen("/dev/null", "w");
    const Status status = RunLoopbackRanks(world, {}, nullptr, [&](Communicator& comm) {
      return Train(c, {.world = &comm, .world_source = "test", .out = sink}).status();
    });
    std::fclose(sink);
    ZR_RETURN_IF_ERROR(status);
    return testing::MetricLosses(metrics);
  };
  const std::vector<double> one = *run(1, 1, true, "tp1");
  const std::vector<double> two = *run(2, 2, true, "tp2");
  const std::vector<double> unmasked = *run(1, 1, false, "plain");
  ASSERT_EQ(one.size(), 8u);
  ASSERT_EQ(two.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
  }
  EXPECT_GT(std::fabs(unmasked[0] - one[0]), 1e-4) << "the mask changed nothing";
  RunConfig c = SmallRun(dir + "/none.jsonl");
  c.data.path = dir + "/tokens.bin";
  c.data.eod_mask_loss = true;
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  const Status s = Train(c, {.world = group[0].get(), .world_source = "test"}).status();
  EXPECT_NE(s.message().find("data.eod_mask_loss needs the end-of-text token"), std::string::npos)
      << s;
}

// A caller's session has chosen the device (TrainerContext::device): the run takes it rather
// than choosing again (which would warn twice where a GPU is passed over); train.device "" runs
// on the session's CPU even where a GPU is visible, and a device train.device rules out is an
// error naming both.
TEST(TrainerTest, TheSessionsDeviceIsTheRuns) {
  const std::string metrics = ::testing::TempDir() + "/session_device.jsonl";
  auto train = [&](const std::string& want, Device device) {
    std::filesystem::remove(metrics);
    RunConfig c = SmallRun(metrics);
    c.train.steps = 2;
    c.train.device = want;
    std::FILE* sink = std::fopen("/dev/null", "w");
    auto group = *CreateLoopbackGroup(1, {}, nullptr);
    const Status s =
        Train(c, {.world = group[0].get(), .world_source = "test", .device = device, .out = sink})
            .status();
    std::fclose(sink);
    return s;
  };
  EXPECT_TRUE(train("", Device::Cpu()).ok());
  EXPECT_EQ(testing::MetricLosses(metrics).size(), 2u);
  EXPECT_TRUE(train("cpu-async", Device::Cpu()).ok());
  const Status cpu = train("cpu", Device::Cuda(0));
  EXPECT_TRUE(absl::IsInvalidArgument(cpu)) << cpu;
  EXPECT_EQ(cpu.message(), "the session runs on cuda:0, but train.device is \"cpu\"");
  const Status cuda = train("cuda", Device::Cpu());
  EXPECT_EQ(cuda.message(), "the session runs on cpu, but train.device is \"cuda\"");
}

TEST(TrainerTest, MetricsCarryEveryField) {
  const std::string metrics = ::testing::TempDir() + "/fields.jsonl";
  std::filesystem::remove(metrics);  // a new run refuses an earlier run's metrics
  RunConfig c = SmallRun(metrics);
  c.train.steps = 2;
  c.train.eval_interval = 1;
  c.train.sample_tokens = 5;
  c.train.sample_prompt = "ab";
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  std::FILE* sink = std::fopen("/dev/null", "w");
  const TrainResult r = *Train(c, {.world = group[0].get(), .world_source = "test", .out = sink});
  std::fclose(sink);
  EXPECT_EQ(r.steps, 2);
  EXPECT_GT(r.val_loss, 0);
  EXPECT_EQ(r.sample.substr(0, 2), "ab");
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  for (const char* key :
       {"step", "steps", "loss", "val_loss", "grad_norm", "lr", "loss_scale", "skipped",
        "skipped_steps", "tokens", "step_time_s", "tokens_per_s", "tokens_per_s_per_device",
        "tflops_per_device", "mfu", "peak_memory_bytes", "peak_memory_total_bytes"}) {
    EXPECT_TRUE(j.contains(key)) << key << " missing from " << line;
  }
  EXPECT_GT(j["peak_memory_bytes"]["activations"].get<int64_t>(), 0);
  EXPECT_EQ(j["tokens"], 8 * 16);
}

// MFU against train.peak_tflops, on any device: each step's tflops_per_device over the given
// peak; without it the CPU has no peak (null), as a GPU zerort does not know by name.
TEST(TrainerTest, MfuAgainstTheGivenPeak) {
  auto mfus = [](double peak_tflops) {
    const std::string metrics = ::testing::TempDir() + "/mfu.jsonl";
    std::filesystem::remove(metrics);
    RunConfig c = SmallRun(metrics);
    c.train.steps = 2;
    c.train.peak_tflops = peak_tflops;
    auto group = *CreateLoopbackGroup(1, {}, nullptr);
    std::FILE* sink = std::fopen("/dev/null", "w");
    EXPECT_TRUE(Train(c, {.world = group[0].get(), .world_source = "test", .out = sink}).ok());
    std::fclose(sink);
    std::vector<nlohmann::json> lines;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  for (const nlohmann::json& j : mfus(0)) EXPECT_TRUE(j["mfu"].is_null()) << j;
  const std::vector<nlohmann::json> given = mfus(0.25);
  ASSERT_EQ(given.size(), 2u);
  for (const nlohmann::json& j : given) {
    const double tflops = j["tflops_per_device"].get<double>();
    ASSERT_GT(tflops, 0) << j;
    EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), tflops / 0.25) << j;
  }
}

TEST(TrainerTest, RefusesWhatCannotRun) {
  RunConfig c = SmallRun("");
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  Status s = Train(c, {.world = group[0].get(), .world_source = "test", .resume = true}).status();
  EXPECT_NE(s.message().find("--resume needs checkpoint.dir"), std::string::npos) << s;
  c.checkpoint.dir = ::testing::TempDir() + "/never-written";
  std::filesystem::remove_all(c.checkpoint.dir);
  s = Train(c, {.world = group[0].get(), .world_source = "test", .resume = true}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("no checkpoint to resume from"), std::string::npos) << s;
  c.checkpoint.dir.clear();
  if (CudaDeviceCount() == 0) {  // a GPU asked for where there is none
    c.train.device = "cuda";
    s = Train(c, {.world = group[0].get(), .world_source = "test"}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("train.device = \"cuda\""), std::string::npos) << s;
  }
}

// bf16 on the CPU (bf16 storage, fp32 math) follows the fp32 run within bf16's precision.
TEST(TrainerTest, Bf16FollowsFp32) {
  const std::vector<double> fp32 = TrainOn(2, 3, 1, "bf16_reference");
  const std::string metrics = ::testing::TempDir() + "/bf16.jsonl";
  std::filesystem::remove(metrics);
  RunConfig c = SmallRun(metrics);
  c.bf16 = true;
  c.zero.stage = 3;
  c.train_micro_batch_size_per_gpu = 4;
  auto status = RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) {
    std::FILE* sink = std::fopen("/dev/null", "w");
    Status s = Train(c, {.world = &comm, .world_source = "test", .out = sink}).status();
    std::fclose(sink);
    return s;
  });
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<double> bf16 = testing::MetricLosses(metrics);
  ASSERT_EQ(bf16.size(), fp32.size());
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], 3e-2 * fp32[i]) << "step " << i + 1;
  }
  EXPECT_NE(bf16, fp32) << "bf16 rounding changed nothing: not a bf16 run";
}

}  // namespace
}  // namespace zerort
