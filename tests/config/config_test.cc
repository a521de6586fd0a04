// The run-config schema: defaults, DeepSpeed sections, --set overrides, the batch triple, and
// one test per kind of bad input, each checking that the message names the JSON path, the value
// and what was expected.
#include "zerort/config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "zerort/config/run_options.h"
#include "zerort/engine/preflight.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

StatusOr<RunConfig> Parse(const std::string& text) {
  ZR_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, "run.json"));
  return ParseRunConfig(j, "run.json");
}

// The error message of parsing `text` (empty when it parses).
std::string Error(const std::string& text) {
  StatusOr<RunConfig> c = Parse(text);
  return c.ok() ? "" : std::string(c.status().message());
}

// The message of checking the paths of the config `text` names (CheckRunPaths, preflight),
// empty when they are usable; the config must parse.
std::string PathError(const std::string& text) {
  StatusOr<RunConfig> c = Parse(text);
  if (!c.ok()) return StrCat("does not parse: ", c.status().message());
  const Status s = CheckRunPaths(*c, "run.json");
  return s.ok() ? "" : std::string(s.message());
}

#define EXPECT_ERROR_HAS(text, ...) EXPECT_MESSAGE_HAS(Error, text, __VA_ARGS__)
#define EXPECT_PATH_ERROR_HAS(text, ...) EXPECT_MESSAGE_HAS(PathError, text, __VA_ARGS__)
#define EXPECT_MESSAGE_HAS(check, text, ...)                                                  \
  do {                                                                                        \
    const std::string message = check(text);                                                  \
    EXPECT_FALSE(message.empty()) << "accepted: " << text;                                    \
    for (const char* needle : {__VA_ARGS__}) {                                                \
      EXPECT_NE(message.find(needle), std::string::npos) << needle << " not in: " << message; \
    }                                                                                         \
  } while (false)

TEST(ConfigTest, DeepSpeedSectionsAndDefaults) {
  const RunConfig c = *Parse(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_bucket_size": 5e7,
                          "contiguous_gradients": true,
                          "offload_optimizer": {"device": "none"}},
    "bf16": {"enabled": true},
    "optimizer": {"type": "adamw", "params": {"lr": 6e-4, "betas": [0.9, 0.95],
                                             "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10,
                                                       "total_num_steps": 100}},
    "gradient_clipping": 1.0,
    "model": {"preset": "tiny", "seq_len": 32, "activation_checkpointing": true,
              "head_chunk_rows": 96}
  })");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_FALSE(c.manager.overlap_comm);
  EXPECT_EQ(c.manager.reduce_bucket_size, 50'000'000);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.optimizer.type, "AdamW");  // case-insensitive, DeepSpeed's spelling kept
  EXPECT_FLOAT_EQ(c.optimizer.betas[1], 0.95f);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_FLOAT_EQ(c.scheduler.cos_min_ratio, 0.0001f);  // DeepSpeed's default
  EXPECT_EQ(c.model.shape.d_model, 64);                 // from the preset
  EXPECT_EQ(c.model.shape.seq_len, 32);                 // overridden
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_EQ(c.model.head_chunk_rows, 96);
  EXPECT_EQ(c.steps_per_print, 10);
  // The resolved config round-trips.
  const RunConfig again = *ParseRunConfig(c.ToJson(), "resolved");
  EXPECT_EQ(again.ToJson(), c.ToJson());
}

TEST(ConfigTest, SetOverridesAKeyBeforeValidation) {
  const std::string path = ::testing::TempDir() + "/set.json";
  std::ofstream(path)
      << R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}})";
  const RunConfig c = *LoadRunConfig(
      path, {"zero_optimization.stage=3", "optimizer.params.lr=0.01", "train.device=cpu"});
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 0.01f);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_NE(LoadRunConfig(path, {"zero_optimization.stage=5"})
                .status()
                .message()
                .find("zero_optimization.stage = 5"),
            std::string::npos);
  EXPECT_FALSE(LoadRunConfig(path, {"no_equals_sign"}).ok());
}

TEST(ConfigTest, BatchTripleResolvesOrShowsTheNumbers) {
  RunConfig c;
  c.train_micro_batch_size_per_gpu = 4;
  c.gradient_accumulation_steps = 2;
  ASSERT_TRUE(ResolveBatch(c, 4, "mpirun").ok());
  EXPECT_EQ(c.train_batch_size, 32);
  RunConfig d;
  d.train_batch_size = 32;
  d.train_micro_batch_size_per_gpu = 4;
  ASSERT_TRUE(ResolveBatch(d, 2, "mpirun").ok());
  EXPECT_EQ(d.gradient_accumulation_steps, 4);
  RunConfig e;
  e.train_batch_size = 30;
  e.train_micro_batch_size_per_gpu = 4;
  e.gradient_accumulation_steps = 2;
  const Status s = ResolveBatch(e, 4, "world size 4 from OMPI_COMM_WORLD_SIZE");
  for (const char* needle :
       {"4 x 2 x 4 = 32 != 30", "OMPI_COMM_WORLD_SIZE", "train_batch_size = 30"}) {
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  }
  RunConfig f;
  f.train_batch_size = 10;
  EXPECT_NE(ResolveBatch(f, 4, "x").message().find("not a multiple of 4"), std::string::npos);
  RunConfig g;
  EXPECT_NE(ResolveBatch(g, 1, "x").message().find("train_micro_batch_size_per_gpu"),
            std::string::npos);
}

TEST(ConfigTest, UnknownKeysAtEveryLevelWithDidYouMean) {
  EXPECT_ERROR_HAS(R"({"train_batch_sise": 8})", "unknown key 'train_batch_sise'",
                   "did you mean 'train_batch_size'");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stgae": 2}})",
                   "unknown key 'zero_optimization.stgae'", "zero_optimization.stage");
  EXPECT_ERROR_HAS(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1, "wd": 0.1}}})",
                   "optimizer.params.wd");
  EXPECT_ERROR_HAS(R"({"model": {"n_layers": 2}})", "did you mean 'model.n_layer'");
}

TEST(ConfigTest, KeyInTheWrongSection) {
  EXPECT_ERROR_HAS(R"({"stage": 2})", "unknown key 'stage'",
                   "belongs in section 'zero_optimization' (zero_optimization.stage)");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"gradient_clipping": 1.0}})",
                   "it belongs at the top level");
}

TEST(ConfigTest, WrongTypes) {
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": "three"}})",
                   "zero_optimization.stage = \"three\"", "expected an integer", "got a string");
  EXPECT_ERROR_HAS(R"({"bf16": {"enabled": 1}})", "bf16.enabled = 1", "true or false");
  EXPECT_ERROR_HAS(R"({"zero_optimization": 3})", "zero_optimization = 3", "an object");
  EXPECT_ERROR_HAS(R"({"optimizer": {"params": {"betas": 0.9}}})", "optimizer.params.betas",
                   "an array of 2 numbers");
  EXPECT_ERROR_HAS(R"([1, 2])", "the top level must be a JSON object");
  EXPECT_ERROR_HAS(R"({"train_batch_size": 8,})", "not valid JSON");
  // A string longer than any path: refused with its start quoted, not echoed whole.
  const std::string x(100000, 'x');
  for (const std::string& text :
       {StrCat(R"({"data": {"path": ")", x, R"("}})"),
        StrCat(R"({"model": {"rope_scaling": {"rope_type": ")", x, R"("}}})")}) {
    const std::string message = Error(text);
    EXPECT_NE(message.find("100000 bytes, longer than any name or path zerort takes (4096)"),
              std::string::npos)
        << message.substr(0, 300);
    EXPECT_LT(message.size(), 400u) << message.substr(0, 300);
  }
}

TEST(ConfigTest, OutOfRangeValues) {
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 5}})", "zero_optimization.stage = 5",
                   "[0, 3]");
  EXPECT_ERROR_HAS(R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.001}}})",
                   "optimizer.params.lr = -0.001", "out of range");
  EXPECT_ERROR_HAS(R"({"train_micro_batch_size_per_gpu": 0})",
                   "train_micro_batch_size_per_gpu = 0");
  EXPECT_ERROR_HAS(R"({"optimizer": {"type": "Lion"}})", "optimizer.type = \"Lion\"",
                   "AdamW, Adam, SGD");
  EXPECT_ERROR_HAS(R"({"model": {"preset": "tiny", "n_head": 5}})", "does not divide");
  EXPECT_ERROR_HAS(R"({"model": {"preset": "gpt9"}})", "gpt9", "gpt2-xl");
  // This session's keys: a bucket of no elements, a negative distance, a string, a huge value.
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"allgather_bucket_size": 0}})",
                   "zero_optimization.allgather_bucket_size = 0");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage3_max_reuse_distance": -1}})",
                   "zero_optimization.stage3_max_reuse_distance = -1");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage3_max_reuse_distance": "1e9"}})",
                   "zero_optimization.stage3_max_reuse_distance");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"allgather_bucket_size": 1e300}})",
                   "zero_optimization.allgather_bucket_size");
  EXPECT_ERROR_HAS(R"({"model": {"head_chunk_rows": -1}})", "model.head_chunk_rows = -1");
  EXPECT_ERROR_HAS(R"({"model": {"head_chunk_rows": 1.5}})", "model.head_chunk_rows = 1.5");
  EXPECT_ERROR_HAS(R"({"model": {"head_chunk_rows": 1e300}})", "model.head_chunk_rows");
  EXPECT_ERROR_HAS(R"({"model": {"head_chunk_rows": "all"}})", "model.head_chunk_rows");
  // offload_optimizer.ratio (a partial offload): below 0, above 1, huge, a string, an array, an
  // object. null reads as unset (every key's rule: JsonSection::Find), so the default 1.
  for (const char* ratio : {"-0.1", "1.5", "1e300", "\"half\"", "[]", "{}"}) {
    const std::string c = StrCat(
        R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": )",
        ratio, "}}}");
    EXPECT_ERROR_HAS(c, "zero_optimization.offload_optimizer.ratio");
  }
  const StatusOr<RunConfig> unset = Parse(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": null}}})");
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->zero.offload_optimizer.ratio, 1.0);
}

TEST(ConfigTest, DuplicateKeys) {
  EXPECT_ERROR_HAS(R"({"seed": 1, "seed": 2})", "duplicate key 'seed'");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 1, "stage": 2}})",
                   "duplicate key 'zero_optimization.stage'");
  // The same key in two different objects is fine.
  EXPECT_EQ(Error(R"({"fp16": {"enabled": false}, "bf16": {"enabled": true}})"), "");
}

TEST(ConfigTest, AutoWithoutARuleIsRefused) {
  // "auto" has rules for some keys (deepspeed_config_test); elsewhere it names the key.
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"sub_group_size": "auto"}})",
                   "zero_optimization.sub_group_size = \"auto\"", "no rule resolves");
  EXPECT_ERROR_HAS(R"({"model": {"n_layer": "auto"}})", "model.n_layer = \"auto\"");
  // zerort's aio.engine has a value "auto".
  EXPECT_EQ(Error(R"({"aio": {"engine": "auto"}})"), "");
}

TEST(ConfigTest, ContradictionsAndUnsupportedFeatures) {
  EXPECT_ERROR_HAS(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "choose one");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})",
                   "nvme_path is required");
  // Pipeline keys: read, and checked with the numbers.
  const StatusOr<RunConfig> pipeline = Parse(R"({"parallel": {"pipeline_parallel_size": 2,
                      "pipeline_scatter_gather": false}})");
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ(pipeline->parallel.pipeline_parallel_size, 2);
  EXPECT_FALSE(pipeline->parallel.pipeline_scatter_gather);
  EXPECT_ERROR_HAS(R"({"parallel": {"pipeline_scatter_gather": 1}})",
                   "parallel.pipeline_scatter_gather");
  EXPECT_ERROR_HAS(R"({"model": {"preset": "gpt2"},
                      "parallel": {"pipeline_parallel_size": 2, "pipeline_layers": [6, 5]}})",
                   "parallel.pipeline_layers sums to 11 blocks, model.n_layer is 12");
  EXPECT_ERROR_HAS(R"({"model": {"preset": "gpt2"},
                      "parallel": {"pipeline_parallel_size": 5}})",
                   "model.n_layer = 12 does not split into", "5 x 1");
  EXPECT_ERROR_HAS(R"({"model": {"preset": "gpt2"}, "parallel": {"pipeline_parallel_size": 2,
                      "virtual_pipeline_stages": 2}})",
                   "parallel.virtual_pipeline_stages = 2", "\"1f1b\"");
  EXPECT_ERROR_HAS(R"({"parallel": {"pipeline_schedule": "zb-v"}})", "parallel.pipeline_schedule");
  const StatusOr<RunConfig> interleaved =
      Parse(R"({"model": {"preset": "gpt2"}, "parallel": {"pipeline_parallel_size": 2,
                      "pipeline_schedule": "interleaved", "virtual_pipeline_stages": 2,
                      "pipeline_layers": [3, 3, 3, 3]}})");
  ASSERT_TRUE(interleaved.ok()) << interleaved.status();
  EXPECT_EQ(interleaved->parallel.pipeline_layers, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_ERROR_HAS(R"({"parallel": {"make_vocab_size_divisible_by": 0}})",
                   "parallel.make_vocab_size_divisible_by");
  EXPECT_ERROR_HAS(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})",
                   "total_num_steps is required by WarmupDecayLR");
  EXPECT_ERROR_HAS(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})",
                   "scheduler.params.cos_min_ratio is not a parameter of WarmupLR");
  EXPECT_ERROR_HAS(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})",
                   "an SGD parameter");
}

TEST(ConfigTest, OffloadKeysFollowDeepSpeedsRules) {
  // Optimizer offload from stage 1; parameter offload at stage 3 only, ignored below it with a
  // warning, as DeepSpeed ignores it.
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})",
                   "offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3");
  const StatusOr<RunConfig> below =
      Parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  ASSERT_TRUE(below.ok()) << below.status();
  EXPECT_EQ(below->zero.offload_param.device, "none");
  ASSERT_EQ(below->warnings.size(), 1u);
  EXPECT_NE(below->warnings[0].find("offload_param.device = \"cpu\" is ignored at "
                                    "zero_optimization.stage 2"),
            std::string::npos)
      << below->warnings[0];
  // Reading a config touches no path; the preflight's CheckRunPaths does.
  const std::string missing = R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                       {"device": "nvme", "nvme_path": "/nonexistent/swap"}}})";
  EXPECT_EQ(Error(missing), "");
  EXPECT_PATH_ERROR_HAS(missing,
                        "offload_optimizer.nvme_path = \"/nonexistent/swap\" does not exist");
  EXPECT_PATH_ERROR_HAS(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                       {"device": "nvme", "nvme_path": "/etc/hostname"}}})",
                        "is not a directory");
  EXPECT_PATH_ERROR_HAS(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                       {"device": "nvme", "nvme_path": "/proc"}}})",
                        "is not writable");
  EXPECT_EQ(PathError(R"({"zero_optimization": {"stage": 3,
                       "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                       "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})"),
            "");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                       "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}})",
                   "offload_param.device = \"nvme\" needs", "offload_optimizer.device = \"nvme\"");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 3,
                       "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                       "offload_param": {"device": "nvme", "nvme_path": "/var/tmp"}}})",
                   "differs from", "one NVMe file per rank");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 3,
                       "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0.3}}})",
                   "offload_optimizer.ratio = 0.3", "device \"cpu\"");
  EXPECT_ERROR_HAS(R"({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1,
                       "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
                   "offload_optimizer.ratio = 0.5", "OneBitAdam");
  EXPECT_ERROR_HAS(R"({"zero_optimization": {"stage": 1,
                       "offload_optimizer": {"device": "cpu", "buffer_count": 1}}})",
                   "offload_optimizer.buffer_count");
  EXPECT_EQ(Error(R"({"aio": {"use_gds": true}})"), "");  // accepted: it only tunes the I/O
  EXPECT_ERROR_HAS(R"({"aio": {"block_size": 5000}})", "aio.block_size = 5000", "multiple of 4096");
  EXPECT_ERROR_HAS(R"({"aio": {"queue_depth": 0}})", "aio.queue_depth");
  EXPECT_ERROR_HAS(R"({"aio": {"engine": "libaio"}})", "aio.engine");
  EXPECT_ERROR_HAS(R"({"aio": {"block_sise": 4096}})", "block_size");
  // What DeepSpeed's configs carry is accepted.
  StatusOr<RunConfig> ok = ParseRunConfig(nlohmann::json::parse(R"({
      "zero_optimization": {"stage": 3, "sub_group_size": 1e8,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "pin_memory": true,
                              "buffer_count": 4, "fast_init": false, "pipeline_read": false,
                              "pipeline_write": false, "ratio": 1},
        "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 5,
                          "buffer_size": 1e8, "max_in_cpu": 1e9}},
      "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
              "single_submit": false, "overlap_events": true, "use_gds": false}})"),
                                          "ds.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->zero.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(ok->manager.offload.sub_group_size, 100'000'000);
  EXPECT_EQ(ok->manager.offload.aio_block_size, 1 << 20);
  // DeepSpeed's Twin-Flow: a share of the units on the host ([Note: partial optimizer offload]).
  const StatusOr<RunConfig> twin = Parse(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.4}}})");
  ASSERT_TRUE(twin.ok()) << twin.status();
  const ShardManagerOptions twin_options = ShardManagerOptionsFrom(*twin, 1);
  EXPECT_EQ(twin_options.offload.optimizer_ratio, 0.4);
  EXPECT_EQ(twin_options.placement.optimizer, MemoryTier::kPinnedHost);
  const StatusOr<RunConfig> none =
      Parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"ratio": 0.4}}})");
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_EQ(none->warnings.size(), 1u);
  EXPECT_NE(none->warnings[0].find("ratio = 0.4 is ignored"), std::string::npos)
      << none->warnings[0];
  // [Note: gradient sums on the device]: the option reaches the manager with a host tier; NVMe is
  // refused naming the key; without offload it is ignored with a warning.
  const StatusOr<RunConfig> sums = Parse(R"({"train": {"device_grad_sums": true},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_TRUE(sums->warnings.empty());
  EXPECT_TRUE(ShardManagerOptionsFrom(*sums, 1).offload.device_grad_sums);
  EXPECT_FALSE(ShardManagerOptionsFrom(*twin, 1).offload.device_grad_sums);
  EXPECT_ERROR_HAS(R"({"train": {"device_grad_sums": true}, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})",
                   "train.device_grad_sums = true", "nvme");
  EXPECT_ERROR_HAS(R"({"train": {"device_grad_sums": "yes"}})", "train.device_grad_sums");
  const StatusOr<RunConfig> no_offload = Parse(R"({"train": {"device_grad_sums": true}})");
  ASSERT_TRUE(no_offload.ok()) << no_offload.status();
  ASSERT_EQ(no_offload->warnings.size(), 1u);
  EXPECT_NE(no_offload->warnings[0].find("device_grad_sums = true is ignored"), std::string::npos)
      << no_offload->warnings[0];
}

// [Note: partial optimizer offload]: DeepSpeed's rule, i >= floor((1 - ratio) * n) on the host,
// without the float product's rounding (DeepSpeed's (1 - 0.9) * 10 is 0.999...: no unit left on
// the device).
TEST(ConfigTest, PartialOffloadPlacesTheLastUnitsOnTheHost) {
  ShardManagerOptions o;
  o.placement.optimizer = MemoryTier::kPinnedHost;
  const std::vector<std::tuple<double, int, int>> cases = {
      {1.0, 14, 0}, {0.0, 14, 14}, {0.9, 10, 1}, {0.5, 5, 2}, {0.3, 10, 7},
      {0.7, 10, 3}, {0.25, 4, 3},  {0.5, 1, 0},  {0.01, 3, 2}};
  for (const auto& [ratio, units, on_device] : cases) {
    o.offload.optimizer_ratio = ratio;
    EXPECT_EQ(DeviceOptimizerUnits(o, units), on_device) << ratio << " of " << units;
    for (int u = 0; u < units; ++u) {
      EXPECT_EQ(UnitOptimizerTier(o, u, units),
                u < on_device ? MemoryTier::kDevice : MemoryTier::kPinnedHost);
    }
    EXPECT_EQ(DefersHostStep(o, true, units), on_device < units) << ratio << " of " << units;
  }
  o.placement.optimizer = MemoryTier::kDevice;  // no offload: the ratio does not matter
  o.offload.optimizer_ratio = 0.5;
  EXPECT_EQ(DeviceOptimizerUnits(o, 8), 8);
  o.placement.optimizer = MemoryTier::kNvme;  // refused by the config; every unit if it came
  EXPECT_EQ(DeviceOptimizerUnits(o, 8), 0);
  EXPECT_FALSE(DefersHostStep(o, true, 8));
}

TEST(ConfigTest, MissingDataFileAndUnwritableCheckpointDir) {
  const std::string data = R"({"data": {"path": "/nonexistent/tokens.bin"}})";
  EXPECT_EQ(Error(data), "");  // reading looks at no path
  EXPECT_PATH_ERROR_HAS(data, "data.path = \"/nonexistent/tokens.bin\": cannot be read");
  // A directory or a FIFO where the token file is expected: refused before anything runs.
  EXPECT_PATH_ERROR_HAS(R"({"data": {"path": "/tmp"}})",
                        "data.path = \"/tmp\": not a regular file");
  const std::string fifo = ::testing::TempDir() + "/tokens-fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_PATH_ERROR_HAS(R"({"data": {"path": ")" + fifo + R"("}})", "not a regular file");
  std::filesystem::remove(fifo);
  const std::string file = ::testing::TempDir() + "/not-a-dir";
  std::ofstream(file) << "x";
  EXPECT_PATH_ERROR_HAS(R"({"checkpoint": {"dir": ")" + file + R"(/ckpt"}})", "is not a directory");
  // Refused for root too (access() says yes to root; the probe directory does not).
  EXPECT_PATH_ERROR_HAS(R"({"checkpoint": {"dir": "/proc/ckpt"}})",
                        "checkpoint.dir = \"/proc/ckpt\"");
  // Both, in one message under the file's name.
  EXPECT_PATH_ERROR_HAS(
      R"({"data": {"path": "/nonexistent/t.bin"}, "checkpoint": {"dir": "/proc/ckpt"}})",
      "run.json: 2 problems", "data.path", "checkpoint.dir");
  // The check creates nothing.
  const std::string fresh = ::testing::TempDir() + "/fresh-ckpt-dir";
  std::filesystem::remove_all(fresh);
  EXPECT_EQ(PathError(R"({"checkpoint": {"dir": ")" + fresh + R"("}})"), "");
  EXPECT_FALSE(std::filesystem::exists(fresh));
}

// The runtime's options are filled from the config in one place (config/run_options.h), and a
// key's default is the shard manager's own: a default RunConfig gives ShardManagerOptions'
// defaults (the stage aside: a config's default is 0, the manager's 3).
TEST(ConfigTest, RuntimeOptionsComeFromTheConfigAndShareItsDefaults) {
  const ShardManagerOptions defaults;
  const ShardManagerOptions from = ShardManagerOptionsFrom(RunConfig{}, 1);
  EXPECT_EQ(from.stage, ZeroStage::k0);
  EXPECT_EQ(from.reduce_bucket_size, defaults.reduce_bucket_size);
  EXPECT_EQ(from.stage3_prefetch_bucket_size, defaults.stage3_prefetch_bucket_size);
  EXPECT_EQ(from.stage3_max_reuse_distance, defaults.stage3_max_reuse_distance);
  EXPECT_EQ(from.allgather_bucket_size, defaults.allgather_bucket_size);
  EXPECT_EQ(from.offload.param_buffer_count, defaults.offload.param_buffer_count);
  EXPECT_EQ(from.offload.aio_block_size, defaults.offload.aio_block_size);
  EXPECT_EQ(from.loss_scale.hysteresis, defaults.loss_scale.hysteresis);
  EXPECT_EQ(from.loss_scale.max_consecutive_skips, defaults.loss_scale.max_consecutive_skips);
  EXPECT_FLOAT_EQ(from.optimizer.beta2, defaults.optimizer.beta2);
  EXPECT_EQ(from.seed, defaults.seed);
  // A key reaches the option it names.
  const RunConfig c = *Parse(R"({"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 7,
                                 "offload_optimizer": {"device": "cpu", "pin_memory": false}},
                                 "fp16": {"enabled": true, "max_consecutive_skips": 3},
                                 "prescale_gradients": true})");
  const ShardManagerOptions o = ShardManagerOptionsFrom(c, 4);
  EXPECT_EQ(o.stage, ZeroStage::k3);
  EXPECT_EQ(o.stage3_max_reuse_distance, 7);
  EXPECT_EQ(o.placement.optimizer, MemoryTier::kHost);
  EXPECT_EQ(o.compute_dtype, DType::kF16);
  EXPECT_EQ(o.loss_scale.max_consecutive_skips, 3);
  EXPECT_EQ(o.gradient_predivide_factor, 4.0);  // prescale: the whole division before
  EXPECT_ERROR_HAS(R"({"fp16": {"max_consecutive_skips": 0}})", "fp16.max_consecutive_skips");
}

}  // namespace
}  // namespace zerort

namespace zerort {
namespace {

// model.arch is printed from the shape that decides it: a config whose shape was set in code
// saves its real architecture into its checkpoints (export reads it from there).
TEST(ConfigTest, ArchIsPrintedFromTheShape) {
  RunConfig c;
  c.model.shape = *DecoderPreset("llama-tiny");
  EXPECT_EQ(c.ToJson().at("model").at("arch"), "llama");
  c.model.shape = *DecoderPreset("tiny");
  EXPECT_EQ(c.ToJson().at("model").at("arch"), "gpt2");
}

}  // namespace
}  // namespace zerort
