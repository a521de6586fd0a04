// Reading, validating and printing RunConfig.
#include "engine/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/deepspeed_config.h"
#include "engine/json_reader.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

const KeyDirectory& Directory() {
  static const KeyDirectory kDirectory = {
      {"",
       {"train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization",
        "fp16",
        "bf16",
        "optimizer",
        "scheduler",
        "gradient_clipping",
        "steps_per_print",
        "seed",
        "model",
        "data",
        "train",
        "checkpoint",
        "logging",
        "parallel",
        "aio",
        "prescale_gradients",
        "gradient_predivide_factor",
        "wall_clock_breakdown",
        "csv_monitor"}},
      {"csv_monitor", {"enabled", "output_path", "job_name"}},
      {"zero_optimization",
       {"stage", "overlap_comm", "reduce_bucket_size", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "allgather_bucket_size", "contiguous_gradients",
        "offload_optimizer", "offload_param", "sub_group_size",
        "stage3_gather_16bit_weights_on_model_save", "allgather_partitions", "reduce_scatter"}},
      {"zero_optimization.offload_optimizer",
       {"device", "nvme_path", "pin_memory", "buffer_count", "fast_init", "ratio", "pipeline_read",
        "pipeline_write"}},
      {"zero_optimization.offload_param",
       {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}},
      {"aio",
       {"block_size", "queue_depth", "thread_count", "single_submit", "overlap_events", "use_gds",
        "engine"}},
      {"fp16",
       {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
        "min_loss_scale"}},
      {"bf16", {"enabled"}},
      {"optimizer", {"type", "params"}},
      {"optimizer.params",
       {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "momentum",
        "dampening", "nesterov", "max_coeff", "min_coeff"}},
      {"scheduler", {"type", "params"}},
      {"scheduler.params",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
        "warmup_min_ratio", "cos_min_ratio"}},
      {"model",
       {"preset", "n_layer", "n_head", "d_model", "seq_len", "vocab_size",
        "activation_checkpointing", "head_chunk_rows"}},
      {"data", {"path", "validation_fraction"}},
      {"train",
       {"steps", "eval_interval", "eval_windows", "sample_tokens", "sample_prompt",
        "sample_temperature", "sample_top_k", "device", "check_memory"}},
      {"checkpoint", {"dir", "interval", "keep_last_n"}},
      {"logging", {"metrics_file", "level", "trace_file"}},
      {"parallel",
       {"tensor_parallel_size", "sequence_parallel", "make_vocab_size_divisible_by",
        "pipeline_parallel_size", "pipeline_schedule", "virtual_pipeline_stages", "pipeline_layers",
        "pipeline_scatter_gather", "collective_timeout_s"}},
  };
  return kDirectory;
}

constexpr int64_t kMaxInt = int64_t{1} << 53;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// A sub-object, or nullopt (absent, or not an object: then a problem).
std::optional<JsonSection> Section(const JsonSection& parent, std::string_view key,
                                   Problems& problems) {
  StatusOr<std::optional<JsonSection>> s = parent.Object(key);
  if (!s.ok()) {
    problems.Add(s.status());
    return std::nullopt;
  }
  return *s;
}

void ReadOffload(const JsonSection& zero, const char* key, OffloadConfig& out, Problems& problems) {
  std::optional<JsonSection> s = Section(zero, key, problems);
  if (!s) return;
  const bool param = std::string_view(key) == "offload_param";
  if (param) out.buffer_count = 5;  // DeepSpeed's default for parameters
  problems.Add(s->String("device", out.device, {"none", "cpu", "nvme"}));
  problems.Add(s->String("nvme_path", out.nvme_path));
  problems.Add(s->Bool("pin_memory", out.pin_memory));
  problems.Add(s->Int("buffer_count", out.buffer_count, param ? 1 : 2, 1024));
  problems.Add(s->Int("buffer_size", out.buffer_size, 1, kMaxInt));
  problems.Add(s->Int("max_in_cpu", out.max_in_cpu, 0, kMaxInt));
  bool ignored = false;
  // Knobs that only tune how DeepSpeed's own pipeline runs; zerort always pipelines.
  problems.Add(s->Bool("fast_init", ignored));
  problems.Add(s->Bool("pipeline_read", ignored));
  problems.Add(s->Bool("pipeline_write", ignored));
  float ratio = 1.0f;
  problems.Add(s->Float("ratio", ratio, 0.0f, 1.0f));
  out.ratio = ratio;
  s->Finish(problems);
  if (out.ratio != 1.0) {
    return problems.Add(absl::InvalidArgumentError(StrCat(
        s->PathOf("ratio"), " = ", out.ratio,
        ": partial optimizer offload (DeepSpeed's ZeRO++ twin-flow) is not supported; use 1")));
  }
  if (out.device == "nvme" && out.nvme_path.empty()) {
    return problems.Add(absl::InvalidArgumentError(
        StrCat(s->PathOf("nvme_path"), " is required when ", s->PathOf("device"), " is \"nvme\"")));
  }
  if (out.device == "nvme") {
    std::error_code ec;
    const auto status = std::filesystem::status(out.nvme_path, ec);
    if (ec || !std::filesystem::exists(status)) {
      return problems.Add(absl::InvalidArgumentError(
          StrCat(s->PathOf("nvme_path"), " = \"", out.nvme_path, "\" does not exist")));
    }
    if (!std::filesystem::is_directory(status)) {
      return problems.Add(absl::InvalidArgumentError(
          StrCat(s->PathOf("nvme_path"), " = \"", out.nvme_path, "\" is not a directory")));
    }
    // access() answers yes to root: probe with a file that is removed at once.
    const std::string probe = StrCat(out.nvme_path, "/.zerort-probe-", ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      return problems.Add(
          absl::InvalidArgumentError(StrCat(s->PathOf("nvme_path"), " = \"", out.nvme_path,
                                            "\" is not writable: ", std::strerror(errno))));
    }
    ::close(fd);
    ::unlink(probe.c_str());
  }
  return;
}

void ReadAio(const JsonSection& top, AioConfig& out, Problems& problems) {
  std::optional<JsonSection> s = Section(top, "aio", problems);
  if (!s) return;
  problems.Add(s->Int("block_size", out.block_size, 4096, int64_t{1} << 30));
  problems.Add(s->Int("queue_depth", out.queue_depth, 1, 4096));
  problems.Add(s->Int("thread_count", out.thread_count, 1, 256));
  problems.Add(s->Bool("single_submit", out.single_submit));
  problems.Add(s->Bool("overlap_events", out.overlap_events));
  problems.Add(s->String("engine", out.engine, {"auto", "io_uring", "threads"}));
  bool gds = false;
  problems.Add(s->Bool("use_gds", gds));
  s->Finish(problems);
  if (gds) {
    return problems.Add(absl::InvalidArgumentError(
        StrCat(s->PathOf("use_gds"),
               " = true: GPUDirect Storage is not supported; zerort stages NVMe I/O through "
               "pinned host memory (set it to false)")));
  }
  if (out.block_size % 4096 != 0) {
    return problems.Add(
        absl::InvalidArgumentError(StrCat(s->PathOf("block_size"), " = ", out.block_size,
                                          " is not a multiple of 4096 (O_DIRECT's alignment)")));
  }
  return;
}

void ReadScheduler(const JsonSection& top, SchedulerConfig& out, Problems& problems) {
  std::optional<JsonSection> s = Section(top, "scheduler", problems);
  if (!s) return;
  if (!s->Has("type")) {
    return problems.Add(
        absl::InvalidArgumentError("scheduler.type is required (WarmupLR, WarmupDecayLR or "
                                   "WarmupCosineLR)"));
  }
  std::string type;
  problems.Add(s->String("type", type));
  if (Lower(type) == "onecycle" || Lower(type) == "lrrangetest") {
    s->Finish(problems);
    return problems.Add(absl::InvalidArgumentError(StrCat(
        "scheduler.type = \"", type,
        "\": a DeepSpeed scheduler zerort does not implement (it would train with other learning "
        "rates); use WarmupLR, WarmupDecayLR or WarmupCosineLR")));
  }
  problems.Add(s->String("type", out.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}));
  s->Finish(problems);
  std::optional<JsonSection> p = Section(*s, "params", problems);
  static const nlohmann::json kEmpty = nlohmann::json::object();  // outlives the section
  if (!p) p.emplace(kEmpty, "scheduler.params", Directory());
  const bool cosine = out.type == "WarmupCosineLR";
  // DeepSpeed's parameters of each type; another type's parameter is a mistake worth naming.
  const std::vector<std::string> own =
      cosine ? std::vector<std::string>{"warmup_num_steps", "warmup_type", "total_num_steps",
                                        "warmup_min_ratio", "cos_min_ratio"}
      : out.type == "WarmupDecayLR"
          ? std::vector<std::string>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                     "warmup_type", "total_num_steps"}
          : std::vector<std::string>{"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                     "warmup_type"};
  for (const std::string& key : Directory().at("scheduler.params")) {
    if (p->Has(key) && std::find(own.begin(), own.end(), key) == own.end()) {
      return problems.Add(absl::InvalidArgumentError(
          StrCat(p->PathOf(key), " is not a parameter of ", out.type,
                 " (its parameters: ", fmt::format("{}", fmt::join(own, ", ")), ")")));
    }
  }
  problems.Add(p->Float("warmup_min_lr", out.warmup_min_lr, 0.0f, 1e3f));
  problems.Add(p->Float("warmup_max_lr", out.warmup_max_lr, 0.0f, 1e3f));
  problems.Add(p->Int("warmup_num_steps", out.warmup_num_steps, 0, kMaxInt));
  problems.Add(p->String("warmup_type", out.warmup_type, {"log", "linear"}));
  problems.Add(p->Int("total_num_steps", out.total_num_steps, 1, kMaxInt));
  problems.Add(p->Float("warmup_min_ratio", out.warmup_min_ratio, 0.0f, 1.0f));
  problems.Add(p->Float("cos_min_ratio", out.cos_min_ratio, 0.0f, 1.0f));
  p->Finish(problems);
  if (out.type != "WarmupLR" && !p->Has("total_num_steps")) {
    return problems.Add(absl::InvalidArgumentError(
        StrCat("scheduler.params.total_num_steps is required by ", out.type)));
  }
  if (out.type != "WarmupLR" && out.total_num_steps < out.warmup_num_steps) {
    return problems.Add(absl::InvalidArgumentError(
        StrCat("scheduler.params.total_num_steps = ", out.total_num_steps,
               " is below scheduler.params.warmup_num_steps = ", out.warmup_num_steps)));
  }
  return;
}

void ReadModel(const JsonSection& top, ModelConfig& out, Problems& problems) {
  std::optional<JsonSection> s = Section(top, "model", problems);
  if (!s) return;
  std::string preset;
  problems.Add(s->String("preset", preset));
  if (!preset.empty()) {
    StatusOr<GptConfig> p = GptPreset(preset);
    if (!p.ok())
      return problems.Add(
          absl::InvalidArgumentError(StrCat("model.preset: ", p.status().message())));
    out.shape = *p;
  }
  problems.Add(s->Int("n_layer", out.shape.n_layer, 1, 1 << 16));
  problems.Add(s->Int("n_head", out.shape.n_head, 1, 1 << 16));
  problems.Add(s->Int("d_model", out.shape.d_model, 1, 1 << 20));
  problems.Add(s->Int("seq_len", out.shape.seq_len, 1, 1 << 20));
  problems.Add(s->Int("vocab_size", out.shape.vocab_size, 1, 1 << 24));
  problems.Add(s->Bool("activation_checkpointing", out.activation_checkpointing));
  problems.Add(s->Int("head_chunk_rows", out.head_chunk_rows, 0, int64_t{1} << 40));
  s->Finish(problems);
  problems.Add(out.shape.Validate());
}

// Nothing is created here: the directory, or its nearest existing ancestor, must be writable.
Status CheckWritableDir(const std::string& key, const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec)) {
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  if (std::filesystem::exists(p, ec) && !std::filesystem::is_directory(p, ec)) {
    return absl::InvalidArgumentError(
        StrCat(key, " = \"", dir, "\": ", p.string(), " exists and is not a directory"));
  }
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        StrCat(key, " = \"", dir, "\": ", p.string(), " is not writable"));
  }
  // access() says yes to root everywhere; a directory made and removed at once tells the truth
  // (read-only mounts, /proc) and leaves nothing behind.
  std::string probe = (p / ".zerort-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) {
    return absl::InvalidArgumentError(StrCat(key, " = \"", dir, "\": cannot create directories in ",
                                             p.string(), " (", std::strerror(errno), ")"));
  }
  ::rmdir(probe.c_str());
  return absl::OkStatus();
}

Status SetOverride(nlohmann::json& json, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        StrCat("--set '", assignment, "': expected path.to.key=value"));
  }
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  nlohmann::json value;
  JsonLimits limits;
  limits.top_level_object = false;
  StatusOr<nlohmann::json> parsed = ParseJsonText(text, StrCat("--set ", path), limits);
  if (parsed.ok()) {
    value = *std::move(parsed);
  } else if (!text.empty() && (text[0] == '[' || text[0] == '{')) {
    return parsed.status();  // meant as JSON: too deep, a duplicate key, not valid
  } else {
    value = text;  // a bare word is a string
  }
  try {
    (void)value.dump();  // throws on ill-formed UTF-8, which nothing downstream could print
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(
        StrCat("--set for '", path, "': the value is not valid UTF-8"));
  }
  nlohmann::json* node = &json;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot - start);
    if (key.empty())
      return absl::InvalidArgumentError(StrCat("--set '", assignment, "': empty key"));
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return absl::OkStatus();
    }
    nlohmann::json& child = (*node)[key];
    if (child.is_null()) child = nlohmann::json::object();
    if (!child.is_object()) {
      return absl::InvalidArgumentError(
          StrCat("--set '", assignment, "': ", path.substr(0, dot), " is not an object"));
    }
    node = &child;
    start = dot + 1;
  }
}

// The schema proper: every section's keys, types, ranges and cross-checks, each problem added to
// `problems` (a section's reading goes on past its mistakes, so one run shows them all).
RunConfig ParseSchema(const nlohmann::json& json, Problems& problems) {
  RunConfig c;
  const JsonSection top(json, "", Directory());
  {
    top.Finish(problems);
    problems.Add(top.Int("train_batch_size", c.train_batch_size, 1, kMaxInt));
    problems.Add(
        top.Int("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, 1, kMaxInt));
    problems.Add(top.Int("gradient_accumulation_steps", c.gradient_accumulation_steps, 1, kMaxInt));
    problems.Add(top.Float("gradient_clipping", c.gradient_clipping, 0.0f, 1e30f));
    problems.Add(top.Int("steps_per_print", c.steps_per_print, 1, kMaxInt));
    problems.Add(top.Bool("prescale_gradients", c.prescale_gradients));
    problems.Add(top.Number("gradient_predivide_factor", c.gradient_predivide_factor, 1e-6, 1e6));
    problems.Add(top.Bool("wall_clock_breakdown", c.wall_clock_breakdown));
    // With prescale_gradients the factor is not used (DeepSpeed's engine ignores it too).
    int64_t seed = static_cast<int64_t>(c.seed);
    problems.Add(top.Int("seed", seed, 0, kMaxInt));
    c.seed = static_cast<uint64_t>(seed);

    std::optional<JsonSection> zero = Section(top, "zero_optimization", problems);
    if (zero) {
      ZeroConfig& z = c.zero;
      problems.Add(zero->Int("stage", z.stage, 0, 3));
      problems.Add(zero->Bool("overlap_comm", z.overlap_comm));
      problems.Add(zero->Int("reduce_bucket_size", z.reduce_bucket_size, 0, kMaxInt));
      problems.Add(
          zero->Int("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, kMaxInt));
      problems.Add(zero->Int("stage3_param_persistence_threshold",
                             z.stage3_param_persistence_threshold, 0, kMaxInt));
      problems.Add(
          zero->Int("stage3_max_live_parameters", z.stage3_max_live_parameters, 0, kMaxInt));
      problems.Add(zero->Int("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0, kMaxInt));
      problems.Add(zero->Int("allgather_bucket_size", z.allgather_bucket_size, 1, kMaxInt));
      problems.Add(zero->Bool("contiguous_gradients", z.contiguous_gradients));
      problems.Add(zero->Bool("allgather_partitions", z.allgather_partitions));
      problems.Add(zero->Bool("reduce_scatter", z.reduce_scatter));
      problems.Add(zero->Bool("stage3_gather_16bit_weights_on_model_save",
                              z.stage3_gather_16bit_weights_on_model_save));
      zero->Finish(problems);
      // 0: DeepSpeed's one sub-group per parameter; zerort's chunks never span units, so one
      // chunk per unit's shard (ShardedOptimizer::NvmeChunkNumel).
      problems.Add(zero->Int("sub_group_size", z.sub_group_size, 0, kMaxInt));
      ReadOffload(*zero, "offload_optimizer", z.offload_optimizer, problems);
      ReadOffload(*zero, "offload_param", z.offload_param, problems);
      // DeepSpeed's rules: optimizer offload from stage 1, parameter offload at stage 3 only.
      if (z.offload_optimizer.device != "none" && z.stage == 0) {
        problems.Add(absl::InvalidArgumentError(
            "zero_optimization.offload_optimizer.device = \"" + z.offload_optimizer.device +
            "\" needs zero_optimization.stage 1, 2 or 3 (it is 0)"));
      }
      if (z.offload_param.device != "none" && z.stage != 3) {
        // DeepSpeed reads offload_param at stage 3 only and ignores it below: so does zerort,
        // saying so.
        c.warnings.push_back(
            StrCat("zero_optimization.offload_param.device = \"", z.offload_param.device,
                   "\" is ignored at zero_optimization.stage ", z.stage,
                   " (parameters are offloaded at stage 3 only; DeepSpeed ignores it too): the "
                   "parameters stay on the device"));
        z.offload_param = OffloadConfig{};
      }
      if (z.offload_param.device == "nvme" && z.offload_optimizer.device != "nvme") {
        problems.Add(absl::InvalidArgumentError(
            "zero_optimization.offload_param.device = \"nvme\" needs "
            "zero_optimization.offload_optimizer.device = \"nvme\" too"));
      }
      if (z.offload_param.device == "nvme" &&
          z.offload_param.nvme_path != z.offload_optimizer.nvme_path) {
        problems.Add(absl::InvalidArgumentError(
            StrCat("zero_optimization.offload_param.nvme_path = \"", z.offload_param.nvme_path,
                   "\" differs from zero_optimization.offload_optimizer.nvme_path = \"",
                   z.offload_optimizer.nvme_path, "\": zerort keeps one NVMe file per rank")));
      }
      if (z.offload_optimizer.device == "cpu" && z.offload_param.device == "cpu" &&
          z.offload_optimizer.pin_memory != z.offload_param.pin_memory) {
        problems.Add(absl::InvalidArgumentError(
            "zero_optimization.offload_param.pin_memory and offload_optimizer.pin_memory differ"));
      }
    }
    ReadAio(top, c.aio, problems);
    std::optional<JsonSection> fp16 = Section(top, "fp16", problems);
    if (fp16) {
      Fp16Config& f = c.fp16;
      problems.Add(fp16->Bool("enabled", f.enabled));
      problems.Add(fp16->Float("loss_scale", f.loss_scale, 0.0f, 1e30f));
      problems.Add(fp16->Int("initial_scale_power", f.initial_scale_power, 0, 64));
      problems.Add(fp16->Int("loss_scale_window", f.loss_scale_window, 1, 1 << 30));
      problems.Add(fp16->Int("hysteresis", f.hysteresis, 1, 1 << 30));
      problems.Add(fp16->Float("min_loss_scale", f.min_loss_scale, 0.0f, 1e30f));
      if (f.min_loss_scale < 1.0f) {
        c.warnings.push_back(
            StrCat("fp16.min_loss_scale = ", f.min_loss_scale,
                   " is below 1: zerort uses it as the dynamic scale's floor, but newer DeepSpeed "
                   "versions take only an integer here, so this config will not load there"));
      }
      fp16->Finish(problems);
    }
    std::optional<JsonSection> bf16 = Section(top, "bf16", problems);
    if (bf16) {
      problems.Add(bf16->Bool("enabled", c.bf16));
      bf16->Finish(problems);
    }
    if (c.bf16 && c.fp16.enabled) {
      problems.Add(absl::InvalidArgumentError(
          "fp16.enabled and bf16.enabled are both true: choose one compute precision"));
    }
    std::optional<JsonSection> opt = Section(top, "optimizer", problems);
    if (opt) {
      OptimizerConfig& o = c.optimizer;
      // DeepSpeed's other optimizers, refused by name (they would train other numbers).
      std::string type;
      problems.Add(opt->String("type", type));
      const std::string lower = Lower(type);
      if (lower == "onebitadam" || lower == "onebitlamb" || lower == "zerooneadam") {
        problems.Add(absl::InvalidArgumentError(StrCat(
            "optimizer.type = \"", type,
            "\": a DeepSpeed 1-bit optimizer, which zerort does not support: its compressed, "
            "error-compensated all-reduce changes the gradients every rank sees; use AdamW")));
      } else if (!type.empty()) {
        problems.Add(opt->String("type", o.type, {"AdamW", "Adam", "SGD", "Lamb"}));
      }
      opt->Finish(problems);
      std::optional<JsonSection> p = Section(*opt, "params", problems);
      if (p) {
        problems.Add(p->Float("lr", o.lr, 0.0f, 1e3f));
        std::vector<double> betas = {o.beta1, o.beta2};
        problems.Add(p->Numbers("betas", betas, 2, 0.0, 0.999999999));
        o.beta1 = static_cast<float>(betas[0]);
        o.beta2 = static_cast<float>(betas[1]);
        problems.Add(p->Float("eps", o.eps, 0.0f, 1.0f));
        problems.Add(p->Float("weight_decay", o.weight_decay, 0.0f, 1e3f));
        problems.Add(p->Bool("adam_w_mode", o.adam_w_mode));
        problems.Add(p->Bool("bias_correction", o.bias_correction));
        problems.Add(p->Float("max_coeff", o.max_coeff, 0.0f, 1e6f));
        problems.Add(p->Float("min_coeff", o.min_coeff, 0.0f, 1e6f));
        for (const char* key : {"max_coeff", "min_coeff"}) {
          if (o.type != "Lamb" && p->Has(key)) {
            problems.Add(
                StrCat(p->PathOf(key), " is a LAMB parameter, but optimizer.type is ", o.type));
          }
        }
        if (o.min_coeff > o.max_coeff) {
          problems.Add(StrCat("optimizer.params.min_coeff = ", o.min_coeff,
                              " is above optimizer.params.max_coeff = ", o.max_coeff));
        }
        problems.Add(p->Float("momentum", o.momentum, 0.0f, 1.0f));
        problems.Add(p->Float("dampening", o.dampening, 0.0f, 1.0f));
        problems.Add(p->Bool("nesterov", o.nesterov));
        p->Finish(problems);
        const bool sgd = o.type == "SGD";
        for (const char* key : {"momentum", "dampening", "nesterov"}) {
          if (!sgd && p->Has(key)) {
            problems.Add(absl::InvalidArgumentError(
                StrCat(p->PathOf(key), " is an SGD parameter, but optimizer.type is ", o.type)));
          }
        }
        for (const char* key : {"betas", "eps", "adam_w_mode", "bias_correction"}) {
          if (sgd && p->Has(key)) {
            problems.Add(absl::InvalidArgumentError(
                StrCat(p->PathOf(key), " is an Adam parameter, but optimizer.type is SGD")));
          }
        }
        if (o.type == "AdamW" && p->Has("adam_w_mode") && !o.adam_w_mode) {
          problems.Add(absl::InvalidArgumentError(
              "optimizer.params.adam_w_mode = false contradicts optimizer.type AdamW (use "
              "\"Adam\" for L2-coupled weight decay)"));
        }
        if (sgd && o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
          problems.Add(absl::InvalidArgumentError(
              "optimizer.params.nesterov needs momentum > 0 and dampening 0 (as PyTorch's SGD)"));
        }
      }
    }
    ReadScheduler(top, c.scheduler, problems);
    ReadModel(top, c.model, problems);

    std::optional<JsonSection> data = Section(top, "data", problems);
    if (data) {
      problems.Add(data->String("path", c.data.path));
      problems.Add(data->Number("validation_fraction", c.data.validation_fraction, 0.0, 0.5));
      data->Finish(problems);
      if (!c.data.path.empty() && ::access(c.data.path.c_str(), R_OK) != 0) {
        problems.Add(absl::InvalidArgumentError(
            StrCat("data.path = \"", c.data.path, "\": cannot be read (", std::strerror(errno),
                   "); prepare one with `zerort data prepare TEXT_FILE OUT`")));
      }
    }
    std::optional<JsonSection> train = Section(top, "train", problems);
    if (train) {
      TrainConfig& t = c.train;
      problems.Add(train->Int("steps", t.steps, 1, kMaxInt));
      problems.Add(train->Int("eval_interval", t.eval_interval, 0, kMaxInt));
      problems.Add(train->Int("eval_windows", t.eval_windows, 1, 1 << 20));
      problems.Add(train->Int("sample_tokens", t.sample_tokens, 0, 1 << 20));
      problems.Add(train->String("sample_prompt", t.sample_prompt));
      problems.Add(train->Float("sample_temperature", t.sample_temperature, 0.0f, 100.0f));
      problems.Add(train->Int("sample_top_k", t.sample_top_k, 0, 1 << 24));
      problems.Add(train->String("device", t.device, {"cpu", "cuda"}));
      problems.Add(train->Bool("check_memory", t.check_memory));
      train->Finish(problems);
    }
    std::optional<JsonSection> ckpt = Section(top, "checkpoint", problems);
    if (ckpt) {
      problems.Add(ckpt->String("dir", c.checkpoint.dir));
      problems.Add(ckpt->Int("interval", c.checkpoint.interval, 0, kMaxInt));
      problems.Add(ckpt->Int("keep_last_n", c.checkpoint.keep_last_n, 0, 1 << 20));
      ckpt->Finish(problems);
      if (!c.checkpoint.dir.empty()) {
        problems.Add(CheckWritableDir("checkpoint.dir", c.checkpoint.dir));
      }
    }
    std::optional<JsonSection> csv = Section(top, "csv_monitor", problems);
    if (csv) {
      problems.Add(csv->Bool("enabled", c.csv_monitor.enabled));
      problems.Add(csv->String("output_path", c.csv_monitor.output_path));
      problems.Add(csv->String("job_name", c.csv_monitor.job_name));
      csv->Finish(problems);
      if (c.csv_monitor.job_name.empty() || c.csv_monitor.job_name.find('/') != std::string::npos ||
          c.csv_monitor.job_name == "." || c.csv_monitor.job_name == "..") {
        problems.Add(StrCat("csv_monitor.job_name = \"", c.csv_monitor.job_name,
                            "\": expected a plain directory name"));
      } else if (c.csv_monitor.enabled) {
        problems.Add(CheckWritableDir("csv_monitor.output_path", c.csv_monitor.Dir()));
      }
    }
    std::optional<JsonSection> logging = Section(top, "logging", problems);
    if (logging) {
      problems.Add(logging->String("metrics_file", c.logging.metrics_file));
      problems.Add(logging->String("trace_file", c.logging.trace_file));
      problems.Add(logging->String("level", c.logging.level,
                                   {"trace", "debug", "info", "warn", "error", "off"}));
      logging->Finish(problems);
    }
    std::optional<JsonSection> parallel = Section(top, "parallel", problems);
    if (parallel) {
      problems.Add(
          parallel->Int("tensor_parallel_size", c.parallel.tensor_parallel_size, 1, 1 << 16));
      problems.Add(parallel->Bool("sequence_parallel", c.parallel.sequence_parallel));
      problems.Add(parallel->Int("make_vocab_size_divisible_by",
                                 c.parallel.make_vocab_size_divisible_by, 1, 1 << 16));
      problems.Add(
          parallel->Int("pipeline_parallel_size", c.parallel.pipeline_parallel_size, 1, 1 << 16));
      ParallelConfig& par = c.parallel;
      problems.Add(parallel->String("pipeline_schedule", par.pipeline_schedule,
                                    {"gpipe", "1f1b", "interleaved"}));
      problems.Add(
          parallel->Int("virtual_pipeline_stages", par.virtual_pipeline_stages, 1, 1 << 10));
      problems.Add(parallel->Bool("pipeline_scatter_gather", par.pipeline_scatter_gather));
      problems.Add(
          parallel->Number("collective_timeout_s", par.collective_timeout_s, 0.1, 7 * 86400));
      const int chunks = par.pipeline_parallel_size * par.virtual_pipeline_stages;
      if (parallel->Has("pipeline_layers")) {
        std::vector<double> layers;
        problems.Add(
            parallel->Numbers("pipeline_layers", layers, static_cast<size_t>(chunks), 1, 1 << 16));
        int sum = 0;
        for (double l : layers) {
          if (l != static_cast<int>(l)) {
            problems.Add(absl::InvalidArgumentError(
                StrCat("parallel.pipeline_layers: ", l, " is not a whole number of blocks")));
            sum = -1;
            break;
          }
          par.pipeline_layers.push_back(static_cast<int>(l));
          sum += static_cast<int>(l);
        }
        if (sum >= 0 && sum != c.model.shape.n_layer) {
          problems.Add(absl::InvalidArgumentError(StrCat("parallel.pipeline_layers sums to ", sum,
                                                         " blocks, model.n_layer is ",
                                                         c.model.shape.n_layer)));
        }
      } else if (c.model.shape.n_layer % chunks != 0) {
        problems.Add(absl::InvalidArgumentError(
            StrCat("model.n_layer = ", c.model.shape.n_layer,
                   " does not split into pipeline_parallel_size x virtual_pipeline_stages = ",
                   par.pipeline_parallel_size, " x ", par.virtual_pipeline_stages,
                   " equal chunks (give parallel.pipeline_layers)")));
      }
      const bool interleaved = par.pipeline_schedule == "interleaved";
      if (interleaved != (par.virtual_pipeline_stages > 1)) {
        problems.Add(absl::InvalidArgumentError(
            StrCat("parallel.virtual_pipeline_stages = ", par.virtual_pipeline_stages,
                   " with parallel.pipeline_schedule = \"", par.pipeline_schedule,
                   "\": the interleaved schedule needs 2 or more model chunks per stage, the "
                   "others exactly 1")));
      }
      parallel->Finish(problems);
    }
  }
  // LAMB's per-parameter norms are summed over the data-parallel group only.
  if (c.optimizer.type == "Lamb" && c.parallel.tensor_parallel_size > 1) {
    problems.Add(
        "optimizer.type = \"Lamb\" with parallel.tensor_parallel_size > 1 is not implemented (a "
        "split parameter's norm would span the tensor-parallel group too)");
  }
  if (c.optimizer.type == "Lamb" && c.zero.offload_optimizer.device == "nvme") {
    problems.Add(
        "optimizer.type = \"Lamb\" with zero_optimization.offload_optimizer.device \"nvme\" is "
        "not implemented (the norms need a second pass over the streamed chunks); use \"cpu\"");
  }
  return c;
}

}  // namespace

StatusOr<RunConfig> ParseRunConfig(const nlohmann::json& given, const std::string& file) {
  nlohmann::json json = given;
  Problems problems;
  std::vector<std::string> notes;
  AutoKeys autos;
  NormalizeDeepSpeed(json, problems, notes, autos);
  if (!autos.empty()) {
    // The rules read the rest of the config (model.d_model, the optimizer, train.steps).
    Problems ignored;
    const RunConfig first = ParseSchema(json, ignored);
    ResolveAutoValues(autos, first, json, notes);
  }
  RunConfig c = ParseSchema(json, problems);
  if (!problems.empty()) return problems.ToStatus(file);
  c.notes = std::move(notes);  // ParseSchema's own warnings are in c.warnings
  return c;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& file,
                                  const std::vector<std::string>& overrides) {
  ZR_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonFile(file));
  for (const std::string& o : overrides) ZR_RETURN_IF_ERROR(SetOverride(json, o));
  return ParseRunConfig(json, file);
}

Status ResolveBatch(RunConfig& c, int dp, const std::string& dp_source) {
  int64_t& t = c.train_batch_size;
  int64_t& m = c.train_micro_batch_size_per_gpu;
  int64_t& a = c.gradient_accumulation_steps;
  const std::string numbers = StrCat("train_batch_size = ", t ? StrCat(t) : "unset",
                                     ", train_micro_batch_size_per_gpu = ", m ? StrCat(m) : "unset",
                                     ", gradient_accumulation_steps = ", a ? StrCat(a) : "unset",
                                     ", data-parallel size = ", dp, " (", dp_source, ")");
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("batch sizes do not multiply out: ", why, "; ",
                                             numbers,
                                             "; train_batch_size must equal micro x accumulation "
                                             "x data-parallel size"));
  };
  // How each value came to be, for the message when a derived one is out of range.
  std::string m_how = "as given", a_how = "as given";
  if (t && m && a) {
    if (t != m * a * dp) return fail(StrCat(m, " x ", a, " x ", dp, " = ", m * a * dp, " != ", t));
  } else if (t && m) {
    if (t % (m * dp) != 0) return fail(StrCat(t, " is not a multiple of ", m, " x ", dp));
    a = t / (m * dp);
    a_how =
        StrCat("= train_batch_size ", t, " / (micro-batch ", m, " x data-parallel size ", dp, ")");
  } else if (t && a) {
    if (t % (a * dp) != 0) return fail(StrCat(t, " is not a multiple of ", a, " x ", dp));
    m = t / (a * dp);
    m_how =
        StrCat("= train_batch_size ", t, " / (accumulation ", a, " x data-parallel size ", dp, ")");
  } else if (m) {
    if (!a) a = 1;
    if (m > kMaxInt / a / dp) {
      return fail(StrCat(m, " x ", a, " x ", dp, " is more than 2^53 sequences per step"));
    }
    t = m * a * dp;
  } else if (t) {
    if (t % dp != 0) return fail(StrCat(t, " is not a multiple of ", dp));
    m = t / dp;
    a = 1;
    m_how = StrCat("= train_batch_size ", t, " / data-parallel size ", dp,
                   ", with no micro-batch or accumulation given");
  } else {
    return absl::InvalidArgumentError(
        StrCat("set train_micro_batch_size_per_gpu (and gradient_accumulation_steps or "
               "train_batch_size if you like); ",
               numbers));
  }
  // A rank runs at most 2^31 - 1 sequences per micro-batch and micro-batches per step.
  constexpr int64_t kMaxPerRank = 2147483647;
  if (m > kMaxPerRank) {
    return absl::InvalidArgumentError(
        StrCat("train_micro_batch_size_per_gpu ", m, " (", m_how,
               ") is more than 2147483647 sequences per rank and micro-batch; set "
               "train_micro_batch_size_per_gpu or gradient_accumulation_steps"));
  }
  if (a > kMaxPerRank) {
    return absl::InvalidArgumentError(StrCat("gradient_accumulation_steps ", a, " (", a_how,
                                             ") is more than 2147483647 micro-batches per step"));
  }
  return absl::OkStatus();
}

nlohmann::json RunConfig::ToJson() const {
  auto offload = [](const OffloadConfig& o, bool param) {
    nlohmann::json j{{"device", o.device},
                     {"nvme_path", o.nvme_path},
                     {"pin_memory", o.pin_memory},
                     {"buffer_count", o.buffer_count}};
    if (param) {
      j["buffer_size"] = o.buffer_size;
      j["max_in_cpu"] = o.max_in_cpu;
    } else {
      j["ratio"] = o.ratio;
    }
    return j;
  };
  nlohmann::json opt_params = {{"lr", optimizer.lr}, {"weight_decay", optimizer.weight_decay}};
  if (optimizer.type == "SGD") {
    opt_params["momentum"] = optimizer.momentum;
    opt_params["dampening"] = optimizer.dampening;
    opt_params["nesterov"] = optimizer.nesterov;
  } else {
    opt_params["betas"] = {optimizer.beta1, optimizer.beta2};
    opt_params["eps"] = optimizer.eps;
    if (optimizer.type == "Adam") opt_params["adam_w_mode"] = optimizer.adam_w_mode;
    opt_params["bias_correction"] = optimizer.bias_correction;
    if (optimizer.type == "Lamb") {
      opt_params["max_coeff"] = optimizer.max_coeff;
      opt_params["min_coeff"] = optimizer.min_coeff;
    }
  }
  nlohmann::json j = {
      {"zero_optimization",
       {{"stage", zero.stage},
        {"overlap_comm", zero.overlap_comm},
        {"reduce_bucket_size", zero.reduce_bucket_size},
        {"stage3_prefetch_bucket_size", zero.stage3_prefetch_bucket_size},
        {"stage3_param_persistence_threshold", zero.stage3_param_persistence_threshold},
        {"stage3_max_live_parameters", zero.stage3_max_live_parameters},
        {"stage3_max_reuse_distance", zero.stage3_max_reuse_distance},
        {"allgather_bucket_size", zero.allgather_bucket_size},
        {"contiguous_gradients", zero.contiguous_gradients},
        {"allgather_partitions", zero.allgather_partitions},
        {"reduce_scatter", zero.reduce_scatter},
        {"sub_group_size", zero.sub_group_size},
        {"stage3_gather_16bit_weights_on_model_save",
         zero.stage3_gather_16bit_weights_on_model_save},
        {"offload_optimizer", offload(zero.offload_optimizer, false)},
        {"offload_param", offload(zero.offload_param, true)}}},
      {"aio",
       {{"block_size", aio.block_size},
        {"queue_depth", aio.queue_depth},
        {"thread_count", aio.thread_count},
        {"single_submit", aio.single_submit},
        {"overlap_events", aio.overlap_events},
        {"engine", aio.engine}}},
      {"fp16",
       {{"enabled", fp16.enabled},
        {"loss_scale", fp16.loss_scale},
        {"initial_scale_power", fp16.initial_scale_power},
        {"loss_scale_window", fp16.loss_scale_window},
        {"hysteresis", fp16.hysteresis},
        {"min_loss_scale", fp16.min_loss_scale}}},
      {"bf16", {{"enabled", bf16}}},
      {"optimizer", {{"type", optimizer.type}, {"params", opt_params}}},
      {"gradient_clipping", gradient_clipping},
      {"steps_per_print", steps_per_print},
      {"prescale_gradients", prescale_gradients},
      {"gradient_predivide_factor", gradient_predivide_factor},
      {"wall_clock_breakdown", wall_clock_breakdown},
      {"seed", seed},
      {"model",
       {{"n_layer", model.shape.n_layer},
        {"n_head", model.shape.n_head},
        {"d_model", model.shape.d_model},
        {"seq_len", model.shape.seq_len},
        {"vocab_size", model.shape.vocab_size},
        {"activation_checkpointing", model.activation_checkpointing},
        {"head_chunk_rows", model.head_chunk_rows}}},
      {"data", {{"path", data.path}, {"validation_fraction", data.validation_fraction}}},
      {"train",
       {{"steps", train.steps},
        {"eval_interval", train.eval_interval},
        {"eval_windows", train.eval_windows},
        {"sample_tokens", train.sample_tokens},
        {"sample_prompt", train.sample_prompt},
        {"sample_temperature", train.sample_temperature},
        {"sample_top_k", train.sample_top_k},
        {"check_memory", train.check_memory}}},
      {"checkpoint",
       {{"dir", checkpoint.dir},
        {"interval", checkpoint.interval},
        {"keep_last_n", checkpoint.keep_last_n}}},
      {"logging",
       {{"metrics_file", logging.metrics_file},
        {"level", logging.level},
        {"trace_file", logging.trace_file}}},
      {"csv_monitor",
       {{"enabled", csv_monitor.enabled},
        {"output_path", csv_monitor.output_path},
        {"job_name", csv_monitor.job_name}}},
      {"parallel",
       {{"tensor_parallel_size", parallel.tensor_parallel_size},
        {"sequence_parallel", parallel.sequence_parallel},
        {"make_vocab_size_divisible_by", parallel.make_vocab_size_divisible_by},
        {"pipeline_parallel_size", parallel.pipeline_parallel_size},
        {"pipeline_schedule", parallel.pipeline_schedule},
        {"virtual_pipeline_stages", parallel.virtual_pipeline_stages},
        {"pipeline_layers", parallel.pipeline_layers.empty()
                                ? nlohmann::json()  // null: an even split
                                : nlohmann::json(parallel.pipeline_layers)},
        {"pipeline_scatter_gather", parallel.pipeline_scatter_gather},
        {"collective_timeout_s", parallel.collective_timeout_s}}},
  };
  if (!train.device.empty()) j["train"]["device"] = train.device;  // absent: chosen at run time
  // Batch keys not given (0) stay out, so the output reads back as the same config.
  if (train_batch_size) j["train_batch_size"] = train_batch_size;
  if (train_micro_batch_size_per_gpu) {
    j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  }
  if (gradient_accumulation_steps) j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  if (!scheduler.type.empty()) {
    nlohmann::json p;
    if (scheduler.type == "WarmupCosineLR") {
      p = {{"warmup_num_steps", scheduler.warmup_num_steps},
           {"warmup_type", scheduler.warmup_type},
           {"total_num_steps", scheduler.total_num_steps},
           {"warmup_min_ratio", scheduler.warmup_min_ratio},
           {"cos_min_ratio", scheduler.cos_min_ratio}};
    } else {
      p = {{"warmup_min_lr", scheduler.warmup_min_lr},
           {"warmup_max_lr", scheduler.warmup_max_lr},
           {"warmup_num_steps", scheduler.warmup_num_steps},
           {"warmup_type", scheduler.warmup_type}};
      if (scheduler.type == "WarmupDecayLR") p["total_num_steps"] = scheduler.total_num_steps;
    }
    j["scheduler"] = {{"type", scheduler.type}, {"params", p}};
  }
  return j;
}

}  // namespace zerort
