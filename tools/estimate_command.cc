// zerort estimate: the memory model as a command. Three ways in: a run config (the estimate for
// that config, and --measure to prove it against a real step), a model shape and a GPU count (a
// table of layouts: ZeRO stage x offload x activation checkpointing), or a cold parameter count
// and largest layer, as DeepSpeed's cold estimators take them (zerort's runtime's model states
// for every stage and offload layout, the ZeRO paper's figure beside them). Each flag belongs to
// one way in and is checked under its own name.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>

#include "commands.h"
#include "estimate_output.h"
#include "zerort/checkpoint/hf_config.h"
#include "zerort/config/config.h"
#include "zerort/engine/trainer.h"
#include "zerort/estimate/memory_model.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

int Usage(const std::string& message) {
  Logger()->error("estimate: {}", message);
  return kExitUsage;
}

struct EstimateRow {
  int stage;
  std::string offload;  // none | cpu | nvme (optimizer; and parameters at stage 3)
  bool checkpointing;
  MemoryEstimate estimate;
  double device = 0, host_node = 0, nvme = 0;
};

// Expected speed order, fastest first, and the reason: offload moves every step's optimizer work
// over PCIe (NVMe slower still); checkpointing recomputes the forward (about a third more
// compute); higher stages add collectives (stage 3 gathers every unit twice per step).
std::pair<int, std::string> SpeedRank(const EstimateRow& r) {
  const int offload = r.offload == "none" ? 0 : r.offload == "cpu" ? 1 : 2;
  const int rank = offload * 100 + (r.checkpointing ? 10 : 0) + r.stage;
  std::string why = r.offload == "none"  ? "no offload traffic"
                    : r.offload == "cpu" ? "optimizer state over PCIe every step"
                                         : "optimizer state through NVMe every step";
  why += r.checkpointing ? ", forward recomputed (~1.33x compute)" : ", no recomputation";
  static const char* kStage[] = {", no sharding collectives", ", reduce-scatter only",
                                 ", reduce-scatter only", ", gathers each unit twice per step"};
  why += kStage[r.stage];
  return {rank, why};
}

// Every layout (ZeRO stage x offload x each of `checkpointing`) that `estimate` accepts (stage 0
// with offload is not a layout), with its per-node host and NVMe bytes.
using Estimator = std::function<StatusOr<MemoryEstimate>(const MemoryModelInput&)>;
std::vector<EstimateRow> Table(MemoryModelInput base, int ranks_per_node,
                               std::initializer_list<bool> checkpointing,
                               const Estimator& estimate) {
  std::vector<EstimateRow> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* offload : {"none", "cpu", "nvme"}) {
      for (bool ckpt : checkpointing) {
        MemoryModelInput in = base;
        in.SetLayout(stage, offload);
        if (stage == 0) in.data_shard = 0;  // nothing to shard in groups
        if (stage != 3) {                   // ZeRO++ is stage 3's
          in.manager.hpz_partition_size = 1;
          in.manager.quantized_weights = in.manager.quantized_gradients = false;
        }
        if (stage != 0 && in.manager.optimizer.kind == OptimizerKind::kOneBitAdam) {
          in.manager.optimizer.kind = OptimizerKind::kAdamW;  // 1-bit Adam is stage 0's
        }
        in.activation_checkpointing = ckpt;
        StatusOr<MemoryEstimate> e = estimate(in);
        if (!e.ok()) continue;
        EstimateRow r{stage, offload, ckpt, *e};
        r.device = static_cast<double>(e->PeakTotal(MemoryTier::kDevice));
        r.host_node = static_cast<double>(e->PeakTotal(MemoryTier::kPinnedHost) +
                                          e->PeakTotal(MemoryTier::kHost)) *
                      ranks_per_node;
        r.nvme = static_cast<double>(e->PeakTotal(MemoryTier::kNvme)) * ranks_per_node;
        rows.push_back(std::move(r));
      }
    }
  }
  return rows;
}

const char* kCaveats =
    "Not modelled: the CUDA context and cuBLAS/NCCL internal buffers (typically 0.5-1 GiB per "
    "GPU), the CUDA staging copies of offloaded shards and of the gradient sums "
    "train.device_grad_sums copies to the host (on a GPU; on the CPU the first do not exist and "
    "the second are modelled), the few bytes a host value's all-reduce over NCCL stages "
    "through the device (LAMB's per-parameter sums of host-tier units, tied units' host "
    "gradients), host memory of data loading and checkpointing, and the pipeline's boundary "
    "send/receive buffers (one micro-batch's residual stream each).";

// A table row as JSON: the estimate, its layout and the per-rank / per-node totals.
nlohmann::json RowJson(const EstimateRow& r) {
  nlohmann::json j = EstimateJson(r.estimate);
  j["stage"] = r.stage;
  j["offload"] = r.offload;
  j["device_bytes"] = r.device;
  j["host_bytes_per_node"] = r.host_node;
  j["nvme_bytes_per_node"] = r.nvme;
  return j;
}

StatusOr<double> ParseFit(const std::string& text) {
  StatusOr<size_t> bytes = ParseBytes(text);
  if (!bytes.ok()) return bytes.status();
  return static_cast<double>(*bytes);
}

int RunFromConfig(const EstimateOptions& o) {
  StatusOr<RunConfig> config = LoadRunConfig(o.config);
  if (!config.ok()) return Usage(std::string(config.status().message()));
  const bool cuda = o.device == "cuda" || (o.device.empty() && config->train.device == "cuda");
  StatusOr<MemoryModelInput> in = MemoryModelInput::FromConfig(*config, o.world_size, cuda);
  if (!in.ok()) return Usage(std::string(in.status().message()));
  // Absent: every rank on one node; given, 1 to the world size (CLI11 reads "" as 0).
  if (o.given.contains("--ranks-per-node") &&
      (o.ranks_per_node < 1 || o.ranks_per_node > o.world_size)) {
    return Usage(StrCat("--ranks-per-node ", o.ranks_per_node, " is not in [1, --world-size ",
                        o.world_size, "]"));
  }
  if (const Status links = CheckLinkSpeeds(o); !links.ok()) {
    return Usage(std::string(links.message()));
  }
  in->ranks_per_node = o.ranks_per_node > 0 ? o.ranks_per_node : o.world_size;
  StatusOr<std::vector<MemoryEstimate>> stages = EstimateMemoryPerStage(*in);
  if (!stages.ok()) return Usage(std::string(stages.status().message()));
  // With pipeline stages: per category the largest stage's (the busiest rank's needs).
  StatusOr<MemoryEstimate> e = (*stages)[0];
  if (stages->size() > 1) {
    std::vector<MemorySnapshot> peaks;
    for (const MemoryEstimate& s : *stages) {
      peaks.push_back(s.peaks);
      e->parameters = std::max(e->parameters, s.parameters);
      for (int t = 0; t < kNumMemoryTiers; ++t) {
        e->phase_forward[t] = std::max(e->phase_forward[t], s.phase_forward[t]);
        e->phase_backward[t] = std::max(e->phase_backward[t], s.phase_backward[t]);
        e->phase_step[t] = std::max(e->phase_step[t], s.phase_step[t]);
      }
    }
    e->peaks = MaxOverStages(peaks);
    for (const MemoryEstimate& s : *stages) {
      e->comm.intra = std::max(e->comm.intra, s.comm.intra);
      e->comm.inter = std::max(e->comm.inter, s.comm.inter);
    }
  }
  MemorySnapshot measured;
  std::vector<MemorySnapshot> measured_by_rank(static_cast<size_t>(o.world_size));
  std::vector<MemorySnapshot> measured_by_stage;  // the largest of each stage's ranks
  if (o.measure) {
    if (cuda && CudaDeviceCount() == 0) return Usage("--measure on cuda: no GPU is present");
    RunConfig run = *config;
    run.train.steps = 2;  // the second step follows the recorded order, as the model does
    run.train.sample_tokens = 0;
    run.train.device = cuda ? "cuda" : "cpu";
    run.data.validation_fraction = 0.0;
    run.checkpoint.dir.clear();
    run.logging.metrics_file.clear();
    std::FILE* sink = std::fopen("/dev/null", "w");
    CommOptions options;
    options.timeout = std::chrono::seconds(600);
    const Status status =
        RunLoopbackRanks(o.world_size, options, nullptr, [&](Communicator& comm) -> Status {
          ZR_ASSIGN_OR_RETURN(
              TrainResult r,
              Train(run, {.world = &comm, .world_source = "--world-size", .out = sink}));
          measured_by_rank[comm.rank()] = r.last_step_memory;
          return absl::OkStatus();
        });
    measured = MaxOverStages(measured_by_rank);
    const int ranks_per_stage = o.world_size / in->pp;
    for (int st = 0; st < in->pp; ++st) {  // Megatron's order: the stage is the slowest coordinate
      measured_by_stage.push_back(MaxOverStages(
          std::vector<MemorySnapshot>(measured_by_rank.begin() + st * ranks_per_stage,
                                      measured_by_rank.begin() + (st + 1) * ranks_per_stage)));
    }
    std::fclose(sink);
    if (!status.ok()) {
      Logger()->error("estimate --measure: {}", status.message());
      return kExitRuntimeFailure;
    }
  }
  if (o.json) {
    nlohmann::json j = EstimateJson(*e);
    j["comm"] = CommJson(e->comm, o);
    j["config"] = o.config;
    j["world_size"] = o.world_size;
    if (stages->size() > 1) {
      nlohmann::json per_stage = nlohmann::json::array();
      for (int st = 0; st < in->pp; ++st) {
        const MemoryEstimate& se = (*stages)[st];
        nlohmann::json entry = {
            {"parameters", se.parameters},
            {"device_total", se.PeakTotal(MemoryTier::kDevice)},
            {"activations", se.Peak(MemoryTier::kDevice, MemoryCategory::kActivations)}};
        if (o.measure) {
          const MemorySnapshot& stage_max = measured_by_stage[st];
          entry["measured_device_total"] = stage_max.in_use[0].peak;
          entry["measured_activations"] =
              stage_max.Get(MemoryTier::kDevice, MemoryCategory::kActivations).peak;
        }
        per_stage.push_back(entry);
      }
      j["stages"] = per_stage;
    }
    if (o.measure) {
      nlohmann::json m = nlohmann::json::object();
      for (int k = 0; k < kNumMemoryCategories; ++k) {
        m[std::string(MemoryCategoryName(static_cast<MemoryCategory>(k)))] =
            measured.Get(MemoryTier::kDevice, static_cast<MemoryCategory>(k)).peak;
      }
      j["measured_device"] = {{"categories", m},
                              {"total", measured.in_use[0].peak},
                              {"reserved", measured.reserved[0].peak}};
    }
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf(
      "zerort estimate: %s on %d ranks (data %d x tensor %d x pipeline %d) on %s (per rank, "
      "steady-state step)\n",
      o.config.c_str(), o.world_size, in->dp, in->tp, in->pp, cuda ? "cuda" : "cpu");
  std::printf(
      "  %lld parameters on this rank, ZeRO-%d, %s, micro-batch %d x %d, %d micro-batches"
      "%s\n",
      static_cast<long long>(e->parameters), in->stage(),
      std::string(DTypeName(in->compute())).c_str(), in->micro_batch, in->model.seq_len,
      in->accumulation, in->activation_checkpointing ? ", activation checkpointing" : "");
  if (stages->size() > 1) {
    std::printf("  pipeline: %d stages (%s); the table is the maximum over stages (and ranks)\n",
                in->pp, in->pipeline_schedule.c_str());
    for (int st = 0; st < in->pp; ++st) {
      const MemoryEstimate& se = (*stages)[st];
      std::printf("    stage %d: %lld parameters, device peak %s MiB", st,
                  static_cast<long long>(se.parameters),
                  Mib(se.PeakTotal(MemoryTier::kDevice)).c_str());
      if (o.measure) {
        std::printf(", measured %s MiB", Mib(measured_by_stage[st].in_use[0].peak).c_str());
      }
      std::printf("\n");
    }
  }
  PrintCategories(*e, o.measure ? &measured : nullptr);
  std::printf("  communication per step (this rank; %d ranks per node): %s\n", in->ranks_per_node,
              CommText(e->comm, o).c_str());
  if (o.explain) Explain(*e);
  std::printf("%s\n", kCaveats);
  return kExitOk;
}

// Cold mode: the model states of --params parameters whose largest layer has
// --largest-layer-params, as zerort's runtime keeps them (EstimateColdModelStates: the memory
// model's replay with a run config's defaults over a decoder fitted to the two counts), for every
// stage and offload layout; the ZeRO paper's 2 + 2 + 12 bytes per parameter as a labelled
// reference column.
int RunCold(const EstimateOptions& o, int gpus) {
  if (!(o.params >= 1 && o.params <= 1e15)) {
    return Usage(StrCat("--params ", o.params, ": must be in [1, 1e15]"));
  }
  if (!(o.largest_layer_params >= 1 && o.largest_layer_params <= o.params)) {
    return Usage(
        StrCat("--largest-layer-params ", o.largest_layer_params, ": must be in [1, --params]"));
  }
  const auto params = static_cast<int64_t>(std::llround(o.params));
  const auto largest = static_cast<int64_t>(std::llround(o.largest_layer_params));
  StatusOr<ColdDecoder> decoder = FitColdDecoder(params, largest);
  if (!decoder.ok()) return Usage(std::string(decoder.status().message()));
  MemoryModelInput base;
  base.dp = gpus;
  base.ranks_per_node = o.gpus;
  base.manager.compute_dtype = DType::kBF16;
  base.cuda = true;
  const std::vector<EstimateRow> rows = Table(
      base, o.gpus, {false},
      [&](const MemoryModelInput& in) { return EstimateColdModelStates(in, params, largest); });
  if (rows.empty()) {  // FitColdDecoder passed: every layout failing is not the input's doing
    return Usage(std::string(EstimateColdModelStates(base, params, largest).status().message()));
  }
  auto device = [](const MemoryEstimate& e, MemoryCategory c) {
    return static_cast<double>(e.Peak(MemoryTier::kDevice, c));
  };
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const EstimateRow& r : rows) {
      nlohmann::json j = RowJson(r);
      if (r.offload == "none")
        j["zero_paper_bytes"] = ZeroPaperModelStates(o.params, gpus, r.stage);
      out.push_back(j);
    }
    std::printf("%s\n", nlohmann::json{{"params", params},
                                       {"largest_layer_params", largest},
                                       {"gpus", gpus},
                                       {"decoder",
                                        {{"d_model", decoder->d},
                                         {"blocks", decoder->blocks},
                                         {"embedding_largest", decoder->embedding_largest}}},
                                       {"rows", out}}
                            .dump()
                            .c_str());
    return kExitOk;
  }
  std::printf(
      "zerort estimate: %.4g parameters, largest layer %.4g, %d GPU(s) on %d node(s); cold mode: "
      "the model states as zerort's runtime keeps them (bf16 weights; fp32 masters, gradient "
      "shards, AdamW moments and gradient reduction; a run config's bucket and prefetch "
      "defaults), over a GPT-2-style decoder fitted to these counts (d %lld, %d blocks, the "
      "largest layer %s); per GPU, steady-state step\n",
      o.params, o.largest_layer_params, gpus, o.nodes, static_cast<long long>(decoder->d),
      decoder->blocks, decoder->embedding_largest ? "its embedding" : "a block");
  std::printf("  %-5s %-7s %9s %9s %9s %9s %9s %9s %10s %10s %11s\n", "stage", "offload", "GPU GiB",
              "params", "grads", "optim", "gathered", "buffers", "host/node", "NVMe/node",
              "ZeRO paper");
  for (const EstimateRow& r : rows) {
    const MemoryEstimate& e = r.estimate;
    std::printf(
        "  %-5d %-7s %9s %9s %9s %9s %9s %9s %10s %10s %11s\n", r.stage, r.offload.c_str(),
        Gib(r.device).c_str(), Gib(device(e, MemoryCategory::kParameters)).c_str(),
        Gib(device(e, MemoryCategory::kGradients)).c_str(),
        Gib(device(e, MemoryCategory::kOptimizerState)).c_str(),
        Gib(device(e, MemoryCategory::kGatheredWeights)).c_str(),
        Gib(device(e, MemoryCategory::kCommBuffers) + device(e, MemoryCategory::kStaging)).c_str(),
        Gib(r.host_node).c_str(), Gib(r.nvme).c_str(),
        r.offload == "none" ? Gib(ZeroPaperModelStates(o.params, gpus, r.stage)).c_str() : "-");
  }
  std::printf(
      "GiB per GPU (host and NVMe per node). ZeRO paper: (2 + 2 + 12) bytes per parameter "
      "divided as the stage divides them, model states only, for reference: zerort also keeps "
      "fp32 gradient shards and reduces through fp32 buffers.\nActivations and workspace need "
      "the shape: use --model or a run config.\n%s\n",
      kCaveats);
  return kExitOk;
}

// Which flags each way in takes; a flag of another way is refused by name instead of ignored.
enum class Mode { kConfig, kShape, kCold };

Status CheckFlags(const EstimateOptions& o, Mode mode) {
  static const std::set<std::string> kConfig = {"--world-size", "--device",    "--measure",
                                                "--explain",    "--json",      "--ranks-per-node",
                                                "--intra-gbps", "--inter-gbps"};
  static const std::set<std::string> kShape = {
      "--model",       "--hf-config",  "--layers",  "--hidden",
      "--heads",       "--vocab",      "--seq-len", "--gpus",
      "--micro-batch", "--nodes",      "--tp",      "--pp",
      "--fit",         "--explain",    "--json",    "--data-shard-size",
      "--intra-gbps",  "--inter-gbps", "--hpz",     "--qwz",
      "--qgz",         "--onebit"};
  static const std::set<std::string> kCold = {"--params", "--largest-layer-params", "--gpus",
                                              "--nodes", "--json"};
  const std::set<std::string>& allowed = mode == Mode::kConfig  ? kConfig
                                         : mode == Mode::kShape ? kShape
                                                                : kCold;
  const char* what = mode == Mode::kConfig ? "with a run config"
                     : mode == Mode::kShape
                         ? "with a model shape (--model, --hf-config or --layers)"
                         : "in cold mode (--params)";
  for (const std::string& flag : o.given) {
    if (!allowed.contains(flag)) {
      return absl::InvalidArgumentError(StrCat(flag, " does not apply ", what, "; it takes ",
                                               fmt::format("{}", fmt::join(allowed, ", "))));
    }
  }
  return absl::OkStatus();
}

// `value` of `flag` in [lo, hi], or an error naming the flag as the user typed it.
Status InRange(const char* flag, int64_t value, int64_t lo, int64_t hi, const char* note = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat(flag, " ", value, ": must be in [", lo, ", ", hi, "]", note));
}

// The model shape of --model or --layers/--hidden/--heads(/--vocab), --seq-len and
// --micro-batch: each flag checked by its own name (at most the shapes the replay holds in
// 64-bit byte counts within a second: GPT-3 175B is 96 layers, d 12288, 96 heads).
StatusOr<DecoderConfig> ShapeOf(const EstimateOptions& o) {
  auto given = [&](const char* flag) { return o.given.contains(flag); };
  DecoderConfig shape;
  if (given("--model") && given("--hf-config")) {
    return absl::InvalidArgumentError("--model and --hf-config both give the shape: give one");
  }
  if (given("--hf-config")) {
    for (const char* flag : {"--layers", "--hidden", "--heads"}) {
      if (given(flag)) {
        return absl::InvalidArgumentError(
            StrCat("--hf-config ", o.hf_config, " and ", flag, " both give the shape: give one"));
      }
    }
    StatusOr<DecoderConfig> hf = ReadHuggingFaceConfig(o.hf_config);
    if (!hf.ok()) return absl::InvalidArgumentError(StrCat("--hf-config: ", hf.status().message()));
    shape = *hf;
  } else if (given("--model")) {
    for (const char* flag : {"--layers", "--hidden", "--heads"}) {
      if (given(flag)) {
        return absl::InvalidArgumentError(
            StrCat("--model ", o.model, " and ", flag, " both give the shape: give one"));
      }
    }
    StatusOr<DecoderConfig> preset = DecoderPreset(o.model);
    if (!preset.ok()) {
      return absl::InvalidArgumentError(
          StrCat("--model ", o.model, ": ", preset.status().message()));
    }
    shape = *preset;
  } else {
    // What was given is checked first, then what is missing.
    if (given("--layers")) ZR_RETURN_IF_ERROR(InRange("--layers", o.layers, 1, 4096));
    if (given("--hidden")) ZR_RETURN_IF_ERROR(InRange("--hidden", o.hidden, 1, 1 << 18));
    if (given("--heads")) ZR_RETURN_IF_ERROR(InRange("--heads", o.heads, 1, 1 << 14));
    for (const char* flag : {"--layers", "--hidden", "--heads"}) {
      if (!given(flag)) {
        return absl::InvalidArgumentError(
            StrCat("a shape needs --layers, --hidden and --heads (and --vocab); ", flag,
                   " is missing (or give --model NAME)"));
      }
    }
    if (o.hidden % o.heads != 0) {
      return absl::InvalidArgumentError(
          StrCat("--heads ", o.heads, " does not divide --hidden ", o.hidden));
    }
    shape = DecoderConfig{o.layers, o.heads, o.hidden, 1024, o.vocab};
  }
  if (given("--vocab")) {
    ZR_RETURN_IF_ERROR(InRange("--vocab", o.vocab, 1, 10'000'000));
    shape.vocab_size = o.vocab;
  }
  if (given("--seq-len")) {
    ZR_RETURN_IF_ERROR(InRange("--seq-len", o.seq_len, 1, 1 << 20));
    shape.seq_len = o.seq_len;
  }
  ZR_RETURN_IF_ERROR(InRange("--micro-batch", o.micro_batch, 1, 1 << 24));
  if (int64_t{o.micro_batch} * shape.seq_len > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(StrCat("--micro-batch ", o.micro_batch, " x sequence length ",
                                             shape.seq_len,
                                             ": at most 2^24 tokens per micro-batch"));
  }
  ZR_RETURN_IF_ERROR(shape.Validate());
  // The largest terms, in doubles: beyond 2^53 bytes (8 PiB) per rank the replay's 64-bit
  // counters could wrap, and no machine holds it anyway.
  const double L = shape.n_layer, H = shape.n_head, T = shape.seq_len;
  const double d = std::max(shape.d_model, shape.attention_channels());
  const double rows = static_cast<double>(o.micro_batch) * T;
  const double f = shape.ffn_channels();
  const double largest =
      std::max({16.0 * static_cast<double>(shape.NumParameters()), 4.0 * rows * shape.vocab_size,
                4.0 * L * o.micro_batch * H * T * T, 4.0 * L * rows * (8.0 * d + 3.0 * f)});
  if (largest > 9007199254740992.0) {
    return absl::InvalidArgumentError(StrCat("this shape needs more than 8 PiB per rank (", largest,
                                             " bytes in its largest term): not modelled"));
  }
  return shape;
}

}  // namespace

int RunEstimate(const EstimateOptions& o) {
  const Mode mode = !o.config.empty() ? Mode::kConfig
                    : o.given.contains("--params") || o.given.contains("--largest-layer-params")
                        ? Mode::kCold
                    : o.given.contains("--model") || o.given.contains("--hf-config") ||
                            o.given.contains("--layers") || o.given.contains("--hidden") ||
                            o.given.contains("--heads")
                        ? Mode::kShape
                        : Mode::kCold;
  if (mode == Mode::kCold && !o.given.contains("--params") &&
      !o.given.contains("--largest-layer-params")) {
    return Usage(
        "give a run config, --model NAME, --hf-config FILE, --layers/--hidden/--heads/--vocab, "
        "or "
        "--params/--largest-layer-params");
  }
  if (const Status flags = CheckFlags(o, mode); !flags.ok()) {
    return Usage(std::string(flags.message()));
  }
  if (mode == Mode::kConfig) {
    if (o.world_size < 1) return Usage(StrCat("--world-size ", o.world_size, ": must be >= 1"));
    return RunFromConfig(o);
  }
  if (const Status g = InRange("--gpus", o.gpus, 1, 1 << 20); !g.ok()) {
    return Usage(std::string(g.message()));
  }
  if (const Status n = InRange("--nodes", o.nodes, 1, 1 << 20); !n.ok()) {
    return Usage(std::string(n.message()));
  }
  if (int64_t{o.gpus} * o.nodes > (1 << 20)) {
    return Usage(StrCat("--gpus ", o.gpus, " x --nodes ", o.nodes, ": at most 2^20 in all"));
  }
  const int gpus = o.gpus * o.nodes;  // at most 2^20: no overflow
  if (mode == Mode::kCold) return RunCold(o, gpus);
  for (const auto& [flag, v] : {std::pair{"--tp", o.tp}, std::pair{"--pp", o.pp}}) {
    if (const Status s = InRange(flag, v, 1, gpus, " (at most the GPUs)"); !s.ok()) {
      return Usage(std::string(s.message()));
    }
  }
  if (gpus % (o.tp * o.pp) != 0) {
    return Usage(StrCat("--tp ", o.tp, " x --pp ", o.pp, " does not divide the ", gpus,
                        " GPUs (--gpus x --nodes)"));
  }
  std::optional<double> fit;
  if (!o.fit.empty()) {
    StatusOr<double> f = ParseFit(o.fit);
    if (!f.ok()) return Usage(StrCat("--fit ", o.fit, ": ", f.status().message()));
    fit = *f;
  }
  MemoryModelInput base;
  {
    StatusOr<DecoderConfig> shape = ShapeOf(o);
    if (!shape.ok()) return Usage(std::string(shape.status().message()));
    base.model = *shape;
  }
  base.micro_batch = o.micro_batch;
  base.dp = gpus / (o.tp * o.pp);
  base.tp = o.tp;
  base.sequence_parallel = o.tp > 1;  // Megatron's practice with tensor parallelism
  base.pp = o.pp;
  base.accumulation = o.pp;  // 1F1B with m = p micro-batches: every stage's most in flight
  base.ranks_per_node = o.gpus;
  base.manager.compute_dtype = DType::kBF16;
  base.cuda = true;
  base.data_shard = o.data_shard_size;
  if (o.data_shard_size < 0 || (o.data_shard_size > 0 && base.dp % o.data_shard_size != 0)) {
    return Usage(StrCat("--data-shard-size ", o.data_shard_size,
                        " does not divide the data-parallel size ", base.dp));
  }
  if (const Status links = CheckLinkSpeeds(o); !links.ok()) {
    return Usage(std::string(links.message()));
  }
  const int shard_ranks = o.data_shard_size > 0 ? o.data_shard_size : base.dp;
  if (o.hpz < 1 || shard_ranks % o.hpz != 0) {
    return Usage(StrCat("--hpz ", o.hpz, " does not divide the shard group size ", shard_ranks));
  }
  if (o.qgz && o.data_shard_size > 0) {
    return Usage(
        "--qgz with --data-shard-size is not implemented (qgZ's levels are the nodes "
        "of the whole data group)");
  }
  base.manager.hpz_partition_size = o.hpz;
  base.manager.quantized_weights = o.qwz;
  base.manager.quantized_gradients = o.qgz;
  if (o.onebit) base.manager.optimizer.kind = OptimizerKind::kOneBitAdam;
  const bool timed = o.intra_gbps > 0 || o.inter_gbps > 0;
  const auto t0 = std::chrono::steady_clock::now();
  // Every stage's table; each row keeps the stage with the largest device peak (what must fit).
  std::vector<EstimateRow> rows;
  for (int s = 0; s < o.pp; ++s) {
    MemoryModelInput in = base;
    in.pipeline_stage = s;
    std::vector<EstimateRow> stage_rows = Table(in, o.gpus, {false, true}, EstimateMemory);
    if (stage_rows.empty()) return Usage(std::string(EstimateMemory(in).status().message()));
    if (rows.empty()) {
      rows = std::move(stage_rows);
      continue;
    }
    for (size_t i = 0; i < rows.size() && i < stage_rows.size(); ++i) {
      if (stage_rows[i].device > rows[i].device) rows[i] = std::move(stage_rows[i]);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (fit) {
    std::vector<EstimateRow> fitting;
    for (const EstimateRow& r : rows) {
      // What the allocator holds at its peak must fit, not just the bytes in use.
      if (r.estimate.PeakReserved(MemoryTier::kDevice) <= *fit) fitting.push_back(r);
    }
    std::sort(fitting.begin(), fitting.end(), [](const EstimateRow& a, const EstimateRow& b) {
      return SpeedRank(a).first < SpeedRank(b).first;
    });
    rows = std::move(fitting);
  }
  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const EstimateRow& r : rows) {
      nlohmann::json j = RowJson(r);
      j["comm"] = CommJson(r.estimate.comm, o);
      j["activation_checkpointing"] = r.checkpointing;
      if (fit) j["why"] = SpeedRank(r).second;
      out.push_back(j);
    }
    std::printf("%s\n",
                nlohmann::json{{"model", base.model.NumParameters()}, {"gpus", gpus}, {"rows", out}}
                    .dump()
                    .c_str());
    return kExitOk;
  }
  std::printf(
      "zerort estimate: %s (%.1fM parameters, %s), %d GPU(s) on %d node(s)%s, micro-batch %d, "
      "bf16, %s; per GPU, steady-state step\n",
      !o.model.empty()       ? o.model.c_str()
      : !o.hf_config.empty() ? o.hf_config.c_str()
                             : "custom shape",
      base.model.NumParameters() / 1e6, base.model.Describe().c_str(), gpus, o.nodes,
      o.tp * o.pp > 1
          ? StrCat(", tp ", o.tp, o.tp > 1 ? " (SP)" : "", " x pp ", o.pp,
                   o.pp > 1 ? " (1F1B, m = pp; the largest stage)" : "", " x dp ", base.dp)
                .c_str()
          : "",
      o.micro_batch, o.onebit ? "AdamW (stage 0: 1-bit Adam after freeze_step)" : "AdamW");
  if (fit) {
    std::printf("layouts that fit in %s GiB per GPU, expected fastest first:\n", Gib(*fit).c_str());
  }
  std::printf("  %-5s %-7s %-5s %10s %10s %10s %10s %10s %10s %12s %10s %9s %9s%s%s\n", "stage",
              "offload", "ckpt", "GPU GiB", "reserved", "params", "grads", "optim", "activ.",
              "host/node", "NVMe/node", "GB node", "GB across", timed ? "    comm s" : "",
              fit ? "  why" : "");
  for (const EstimateRow& r : rows) {
    const MemoryEstimate& e = r.estimate;
    auto dev = [&](MemoryCategory c) { return Gib(e.Peak(MemoryTier::kDevice, c)); };
    std::printf(
        "  %-5d %-7s %-5s %10s %10s %10s %10s %10s %10s %12s %10s%s%s%s%s\n", r.stage,
        r.offload.c_str(), r.checkpointing ? "on" : "off", Gib(r.device).c_str(),
        Gib(e.PeakReserved(MemoryTier::kDevice)).c_str(), dev(MemoryCategory::kParameters).c_str(),
        dev(MemoryCategory::kGradients).c_str(), dev(MemoryCategory::kOptimizerState).c_str(),
        dev(MemoryCategory::kActivations).c_str(), Gib(r.host_node).c_str(), Gib(r.nvme).c_str(),
        fmt::format(" {:9.3f} {:9.3f}", e.comm.intra / 1e9, e.comm.inter / 1e9).c_str(),
        timed ? fmt::format(" {:10.4f}", e.comm.Seconds(o.intra_gbps, o.inter_gbps)).c_str() : "",
        fit ? "  " : "", fit ? SpeedRank(r).second.c_str() : "");
  }
  if (fit && rows.empty()) std::printf("  (none: more GPUs, a smaller micro-batch or seq-len)\n");
  if (o.explain && !rows.empty()) Explain(rows.front().estimate);
  std::printf("(%zu layouts estimated in %.3f s)\n%s\n", rows.size(), seconds, kCaveats);
  return kExitOk;
}

}  // namespace zerort::cli
