// DeepSpeed's front end: docs/deepspeed.md's key table equals the key list, every key shows its
// handling with its example value, legacy and alternative names, "auto" by Hugging Face's rules
// against hand-computed values, and every problem of a config in one message.
#include "zerort/config/deepspeed_config.h"
#include "zerort/config/config_schema.h"
#include "zerort/engine/preflight.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "zerort/config/config.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

StatusOr<RunConfig> Parse(const nlohmann::json& j) { return ParseRunConfig(j, "ds.json"); }

std::string Error(const nlohmann::json& j) {
  StatusOr<RunConfig> c = Parse(j);
  return c.ok() ? "" : std::string(c.status().message());
}

bool NotesMention(const RunConfig& c, std::string_view needle) {
  for (const std::string& n : c.notes) {
    if (n.find(needle) != std::string::npos) return true;
  }
  return false;
}

nlohmann::json Sets(std::string_view path, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::object();
  nlohmann::json* node = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key(path.substr(start, dot - start));
    if (dot == std::string_view::npos) {
      (*node)[key] = value;
      return j;
    }
    node = &(*node)[key];
    start = dot + 1;
  }
}

// docs/deepspeed.md's table (between its markers) is the key list's table, row for row.
TEST(DeepSpeedKeysTest, ReadmeTableIsTheKeyList) {
  std::ifstream in(ZR_README);
  ASSERT_TRUE(in) << ZR_README;
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const std::string begin = "<!-- deepspeed-keys:begin -->\n", end = "<!-- deepspeed-keys:end -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "README has no " << begin;
  ASSERT_NE(e, std::string::npos);
  const std::string table = readme.substr(b + begin.size(), e - b - begin.size());
  EXPECT_EQ(table, DeepSpeedKeysMarkdown())
      << "docs/deepspeed.md's DeepSpeed key table differs from config/deepspeed_keys.cc: run "
         "scripts/update_docs.sh";
}

// Each key, alone in a config with its example value, is handled as the list says: implemented
// and mapped keys parse, accepted keys parse with a note naming them, refused keys fail naming
// them and saying why.
TEST(DeepSpeedKeysTest, EveryKeyShowsItsHandling) {
  std::set<std::string> seen;
  for (const DsKey& k : DeepSpeedKeys()) {
    SCOPED_TRACE(std::string(k.path));
    EXPECT_TRUE(seen.insert(std::string(k.path)).second) << "listed twice";
    nlohmann::json j = Sets(k.path, nlohmann::json::parse(k.example));
    if (k.path.starts_with("zero_optimization.offload") ||
        k.path.starts_with("zero_optimization.cpu_offload") ||
        k.path == "zero_optimization.mics_shard_size" ||
        k.path == "zero_optimization.zero_hpz_partition_size" ||
        k.path == "zero_optimization.zero_quantized_weights" ||
        k.path == "zero_optimization.zero_quantized_gradients") {
      j["zero_optimization"]["stage"] = 3;
    }
    if (k.path.starts_with("scheduler.params")) {
      j["scheduler"]["type"] = k.path.ends_with("ratio") ? "WarmupCosineLR" : "WarmupDecayLR";
      if (k.path != "scheduler.params.total_num_steps") {
        j["scheduler"]["params"]["total_num_steps"] = 2000;
      } else {
        j["scheduler"]["params"]["warmup_num_steps"] = 10;
      }
    }
    if (k.path == "optimizer.params.max_coeff" || k.path == "optimizer.params.min_coeff") {
      j["optimizer"]["type"] = "Lamb";
    } else if (k.path == "optimizer.params.freeze_step" ||
               k.path == "optimizer.params.cuda_aware" ||
               k.path == "optimizer.params.comm_backend_name") {
      j["optimizer"]["type"] = "OneBitAdam";  // DeepSpeed's 1-bit Adam: stage 0 only
      j["zero_optimization"]["stage"] = 0;
    } else if (k.path == "optimizer.params.coeff_beta" ||
               k.path.starts_with("optimizer.params.factor_")) {
      j["optimizer"]["type"] = "OneBitLamb";  // DeepSpeed's 1-bit LAMB: stage 0 only
      j["zero_optimization"]["stage"] = 0;
    } else if (k.path.starts_with("optimizer.params.var_") ||
               k.path.starts_with("optimizer.params.local_step")) {
      j["optimizer"]["type"] = "ZeroOneAdam";  // and 0/1 Adam's
      j["zero_optimization"]["stage"] = 0;
    } else if (k.path.starts_with("optimizer.params.") && k.path != "optimizer.params.momentum" &&
               k.path != "optimizer.params.dampening" && k.path != "optimizer.params.nesterov") {
      j["optimizer"]["type"] = "AdamW";
    } else if (k.path.starts_with("optimizer.params.")) {
      j["optimizer"]["type"] = "SGD";
      j["optimizer"]["params"]["momentum"] = 0.9;
    }
    const StatusOr<RunConfig> c = Parse(j);
    switch (k.handling) {
      case DsHandling::kImplemented:
        EXPECT_TRUE(c.ok()) << j.dump() << ": " << c.status();
        break;
      case DsHandling::kMapped:
        ASSERT_TRUE(c.ok()) << j.dump() << ": " << c.status();
        EXPECT_TRUE(NotesMention(*c, k.path)) << "no note for " << k.path;
        break;
      case DsHandling::kAccepted:
        ASSERT_TRUE(c.ok()) << j.dump() << ": " << c.status();
        EXPECT_TRUE(NotesMention(*c, StrCat(k.path, " = "))) << "no note";
        EXPECT_TRUE(NotesMention(*c, k.detail)) << "the note does not say what zerort does";
        break;
      case DsHandling::kRefused: {
        ASSERT_FALSE(c.ok()) << j.dump() << " was accepted";
        const std::string m(c.status().message());
        EXPECT_NE(m.find(k.path), std::string::npos) << m;
        EXPECT_EQ(m.find("unknown key"), std::string::npos)
            << "a DeepSpeed key is never unknown: " << m;
        break;
      }
    }
  }
}

TEST(DeepSpeedKeysTest, RefusedKeysAskingForNothingAreAccepted) {
  EXPECT_EQ(Error({{"amp", {{"enabled", false}, {"opt_level", "O1"}}}}), "");
  EXPECT_EQ(Error({{"communication_data_type", "fp32"}}), "");
  EXPECT_EQ(Error({{"fp16", {{"enabled", false}, {"auto_cast", false}}}}), "");
  EXPECT_EQ(Error({{"compression_training",
                    {{"weight_quantization", {{"shared_parameters", {{"enabled", false}}}}}}}}),
            "");
  EXPECT_NE(Error({{"communication_data_type", "bf16"}}).find("does not support"),
            std::string::npos);
}

TEST(DeepSpeedKeysTest, TyposAreUnknownButDeepSpeedKeysAreNamedAsUnsupported) {
  const std::string typo = Error({{"zero_optimization", {{"stgae", 2}}}});
  EXPECT_NE(typo.find("unknown key 'zero_optimization.stgae'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("did you mean 'zero_optimization.stage'"), std::string::npos) << typo;
  const std::string ds = Error({{"sparse_attention", {{"mode", "fixed"}}}});
  EXPECT_NE(ds.find("a DeepSpeed key zerort does not support"), std::string::npos) << ds;
  EXPECT_EQ(ds.find("unknown"), std::string::npos) << ds;
  // LAMB sums a split parameter's norm over the tensor group; 1-bit LAMB's scales would differ.
  EXPECT_EQ(Error({{"optimizer", {{"type", "Lamb"}}}, {"parallel", {{"tensor_parallel_size", 2}}}}),
            "");
  const std::string lamb =
      Error({{"optimizer", {{"type", "OneBitLamb"}}}, {"parallel", {{"tensor_parallel_size", 2}}}});
  EXPECT_NE(lamb.find("tensor_parallel_size > 1 is not implemented"), std::string::npos) << lamb;
  const std::string onebit =
      Error({{"optimizer", {{"type", "OneBitAdam"}}}, {"zero_optimization", {{"stage", 2}}}});
  EXPECT_NE(onebit.find("run at ZeRO stage 0 only"), std::string::npos) << onebit;
  const std::string zero_one =
      Error({{"optimizer", {{"type", "ZeroOneAdam"}}}, {"zero_optimization", {{"stage", 1}}}});
  EXPECT_NE(zero_one.find("run at ZeRO stage 0 only"), std::string::npos) << zero_one;
  const std::string lamb1 =
      Error({{"optimizer", {{"type", "onebitlamb"}}}, {"zero_optimization", {{"stage", 2}}}});
  EXPECT_NE(lamb1.find("\"OneBitLamb\" with zero_optimization.stage = 2"), std::string::npos)
      << lamb1;
  const std::string lamb_pp = Error(
      {{"optimizer", {{"type", "OneBitLamb"}}}, {"parallel", {{"pipeline_parallel_size", 2}}}});
  EXPECT_NE(lamb_pp.find("pipeline_parallel_size > 1 is not implemented"), std::string::npos)
      << lamb_pp;
  const std::string factors =
      Error({{"optimizer",
              {{"type", "OneBitLamb"}, {"params", {{"factor_min", 5.0}, {"factor_max", 4.0}}}}}});
  EXPECT_NE(factors.find("factor_min = 5 is above optimizer.params.factor_max = 4"),
            std::string::npos)
      << factors;
  const std::string cycle = Error({{"scheduler", {{"type", "OneCycle"}}}});
  EXPECT_NE(cycle.find("scheduler.type = \"OneCycle\""), std::string::npos) << cycle;
}

TEST(DeepSpeedKeysTest, LegacyAndAlternativeNamesMapToTheCurrentOnes) {
  const RunConfig c = *Parse(nlohmann::json::parse(R"({
    "zero_optimization": {"stage": 3, "max_live_parameters": 0, "prefetch_bucket_size": 0,
                          "param_persistence_threshold": 77, "cpu_offload": true,
                          "cpu_offload_use_pin_memory": false,
                          "stage3_gather_fp16_weights_on_model_save": true},
    "bfloat16": {"enabled": true},
    "activation_checkpointing": {"partition_activations": true, "number_checkpoints": 4}
  })"));
  EXPECT_EQ(c.manager.stage3_max_live_parameters, 0);  // DeepSpeed allows 0
  EXPECT_EQ(c.manager.stage3_prefetch_bucket_size, 0);
  EXPECT_EQ(c.manager.stage3_param_persistence_threshold, 77);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_FALSE(c.zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.bf16);
  EXPECT_TRUE(c.model.activation_checkpointing);
  EXPECT_TRUE(NotesMention(c, "bfloat16 read as bf16"));
  const RunConfig legacy = *Parse({{"zero_optimization", true}});
  EXPECT_EQ(legacy.zero.stage, 1);
  // An explicit model.activation_checkpointing decides over DeepSpeed's section.
  const RunConfig off = *Parse(nlohmann::json::parse(
      R"({"activation_checkpointing": {}, "model": {"activation_checkpointing": false}})"));
  EXPECT_FALSE(off.model.activation_checkpointing);
  EXPECT_NE(Error({{"zero_optimization",
                    {{"max_live_parameters", 1}, {"stage3_max_live_parameters", 2}}}})
                .find("are both given"),
            std::string::npos);
  EXPECT_EQ(Error({{"zero_optimization", {{"reduce_bucket_size", 0}}}}), "");
}

// What DeepSpeed 0.19.5's DeepSpeedConfig accepts and changes nothing zerort trains is accepted
// (sub_group_size 0, a gather "auto", "_" comments, cuda_visible_devices), offload_param below
// stage 3 and a fractional fp16.min_loss_scale are warnings, and the two refusals say what
// DeepSpeed does.
TEST(DeepSpeedKeysTest, DeepSpeedsOwnVerdicts) {
  const StatusOr<RunConfig> c = Parse(nlohmann::json::parse(R"({
    "_comment": "a note", "_description": {"owner": "me"}, "cuda_visible_devices": "0,1",
    "zero_optimization": {"stage": 3, "sub_group_size": 0,
                          "stage3_gather_16bit_weights_on_model_save": "auto"},
    "fp16": {"enabled": true, "min_loss_scale": 0.5}
  })"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->manager.offload.sub_group_size, 0);
  EXPECT_FALSE(c->zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(NotesMention(*c, "stage3_gather_16bit_weights_on_model_save = \"auto\" -> false"));
  EXPECT_TRUE(NotesMention(*c, "_comment: a comment"));
  EXPECT_TRUE(NotesMention(*c, "_description: a comment"));
  EXPECT_TRUE(NotesMention(*c, "cuda_visible_devices = \"0,1\": accepted"));
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("fp16.min_loss_scale = 0.5 is below 1"), std::string::npos);
  // A comment is a top-level key only: inside a section "_" keys are still typos.
  EXPECT_NE(Error({{"zero_optimization", {{"_comment", "x"}}}})
                .find("unknown key 'zero_optimization._comment'"),
            std::string::npos);
  EXPECT_NE(Error({{"zero_optimization", {{"sub_group_size", -1}}}})
                .find("zero_optimization.sub_group_size = -1"),
            std::string::npos);
  const std::string norm = Error(nlohmann::json::parse(
      R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}})"));
  EXPECT_NE(norm.find("DeepSpeed's engine refuses it too"), std::string::npos) << norm;
  EXPECT_EQ(norm.find("LAMB"), std::string::npos) << norm;
  const std::string sp = Error({{"seq_parallel_communication_data_type", "bf16"}});
  EXPECT_NE(sp.find("under sequence parallelism DeepSpeed reduces gradients in this dtype"),
            std::string::npos)
      << sp;
}

// Hugging Face's rules, against values computed by hand (model d_model 64 = the tiny preset).
TEST(DeepSpeedKeysTest, AutoIsResolvedByHuggingFacesRules) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": "auto", "eps": "auto",
                                             "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
                  "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                  "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
    "model": {"preset": "tiny"}, "train": {"steps": 37}
  })");
  const StatusOr<RunConfig> parsed = Parse(j);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const RunConfig& c = *parsed;
  EXPECT_EQ(c.model.shape.d_model, 64);
  EXPECT_EQ(c.manager.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.manager.stage3_prefetch_bucket_size, 3686);  // int(0.9 x 4096)
  EXPECT_EQ(c.manager.stage3_param_persistence_threshold, 640);
  EXPECT_FLOAT_EQ(c.manager.gradient_clipping, 1.0f);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  EXPECT_FLOAT_EQ(c.optimizer.betas[0], 0.9f);
  EXPECT_FLOAT_EQ(c.optimizer.betas[1], 0.999f);
  EXPECT_FLOAT_EQ(c.manager.optimizer.eps, 1e-8f);
  EXPECT_FLOAT_EQ(c.manager.optimizer.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(c.scheduler.warmup_min_lr, 0.0f);
  EXPECT_FLOAT_EQ(c.scheduler.warmup_max_lr, 6e-4f);  // the optimizer's lr
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
  EXPECT_EQ(c.scheduler.total_num_steps, 37);  // train.steps
  EXPECT_TRUE(NotesMention(c, "zero_optimization.reduce_bucket_size = \"auto\" -> 4096"));
  // The batch triple follows from the micro-batch and the data-parallel size.
  for (int dp : {1, 2, 4}) {
    RunConfig b = c;
    ASSERT_TRUE(ResolveBatch(b, dp, "test").ok());
    EXPECT_EQ(b.gradient_accumulation_steps, 1);
    EXPECT_EQ(b.train_batch_size, 4 * dp);
  }
  // Given train_batch_size 32 and a micro-batch "auto": accumulation 2 gives micro 16 / dp.
  RunConfig t = *Parse(nlohmann::json::parse(R"({"train_batch_size": 32,
      "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})"));
  for (int dp : {1, 2, 4}) {
    RunConfig b = t;
    ASSERT_TRUE(ResolveBatch(b, dp, "test").ok());
    EXPECT_EQ(b.train_micro_batch_size_per_gpu, 16 / dp) << dp;
  }
  // All three "auto": Hugging Face's per-device default of 8, accumulation 1.
  RunConfig all = *Parse(nlohmann::json::parse(R"({"train_batch_size": "auto",
      "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})"));
  ASSERT_TRUE(ResolveBatch(all, 2, "test").ok());
  EXPECT_EQ(all.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(all.train_batch_size, 16);
}

// An implemented key's text is its field-table row's doc (one text per key); only whole sections
// (no row of their own) carry one here.
TEST(DeepSpeedKeysTest, ImplementedKeysAreFieldTableRows) {
  int rows = 0;
  for (const DsKey& k : DeepSpeedKeys()) {
    if (k.handling != DsHandling::kImplemented) continue;
    const ConfigField* field = FindConfigField(k.path);
    EXPECT_NE(field == nullptr, k.detail.empty()) << k.path;
    rows += field != nullptr ? 1 : 0;
  }
  EXPECT_GE(rows, 50);
}

// csv_monitor names a directory zerort creates: a job name is a plain name, the place writable.
TEST(DeepSpeedKeysTest, CsvMonitorPathsAreChecked) {
  EXPECT_NE(Error({{"csv_monitor", {{"enabled", true}, {"job_name", "../escape"}}}})
                .find("csv_monitor.job_name = \"../escape\": expected a plain directory name"),
            std::string::npos);
  EXPECT_NE(Error({{"csv_monitor", {{"enabled", true}, {"job_name", ""}}}}).find("job_name"),
            std::string::npos);
  // The place is checked at preflight (reading a config touches no path).
  const nlohmann::json proc = {
      {"csv_monitor", {{"enabled", true}, {"output_path", "/proc/zerort"}}}};
  EXPECT_EQ(Error(proc), "");
  EXPECT_NE(
      std::string(CheckRunPaths(*Parse(proc), "ds.json").message()).find("csv_monitor.output_path"),
      std::string::npos);
  EXPECT_NE(Error({{"csv_monitor", {{"enabled", "yes"}}}}).find("csv_monitor.enabled"),
            std::string::npos);
  EXPECT_TRUE(CheckRunPaths(
                  *Parse({{"csv_monitor", {{"enabled", false}, {"output_path", "/proc/zerort"}}}}),
                  "ds.json")
                  .ok());
}

TEST(DeepSpeedKeysTest, OneRunReportsEveryProblem) {
  const std::string m = Error(nlohmann::json::parse(R"({
    "zero_optimization": {"stage": 7, "stgae": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": "fast"}},
    "sparse_attention": {"mode": "fixed"},
    "train": {"steps": 0}
  })"));
  EXPECT_NE(m.find("ds.json: 5 problems"), std::string::npos) << m;
  for (const char* needle :
       {"zero_optimization.stage = 7", "zero_optimization.stgae", "optimizer.params.lr = \"fast\"",
        "sparse_attention", "train.steps = 0"}) {
    EXPECT_NE(m.find(needle), std::string::npos) << needle << " not in " << m;
  }
}

}  // namespace
}  // namespace zerort
