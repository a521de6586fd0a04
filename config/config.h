// RunConfig: the schema of a `zerort train` config, one typed struct per section. Keys follow
// DeepSpeed's names where DeepSpeed has them (its top-level batch keys, zero_optimization, fp16,
// bf16, optimizer, scheduler, gradient_clipping, steps_per_print), so a ds_config.json section can
// be pasted in; zerort's own sections are model, data, train, checkpoint, logging, parallel.
// A member's initializer is its key's default; what each key means, its type and its range are its
// row in the field table (config/config_rows.cc, printed by `zerort config reference` and in
// docs/config.md), and the rules between keys are config/config_rules.cc. LoadRunConfig is strict
// (json_reader.h): unknown keys, wrong types, out-of-range values and duplicates are refused naming
// the JSON path, all of a config's problems in one message; DeepSpeed's other keys, names and
// "auto" values go through config/deepspeed_config.h first. Reading touches no file but the config:
// the paths it names are checked at preflight (engine/preflight.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/data/data_config.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/layers/decoder_config.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/options.h"

namespace zerort {

// The shard manager's own defaults (sharding/options.h): a key that the runtime reads takes its
// default from there, so it is declared once.
inline const ShardManagerOptions& RuntimeDefaults() {
  static const ShardManagerOptions kDefaults;
  return kDefaults;
}

struct OffloadConfig {
  std::string device = "none";
  std::string nvme_path;
  bool pin_memory = true;
  int buffer_count = RuntimeDefaults().offload.optimizer_buffer_count;
  int64_t buffer_size = RuntimeDefaults().offload.param_buffer_size;
  int64_t max_in_cpu = 1'000'000'000;
  double ratio = 1.0;
  // offload_param's defaults: DeepSpeed's 5 buffers for parameters.
  static OffloadConfig ForParams() {
    OffloadConfig o;
    o.buffer_count = RuntimeDefaults().offload.param_buffer_count;
    return o;
  }
};

// zero_optimization's keys that are not the shard manager's options one to one (those bind to
// RunConfig::manager): the stage (an enum there), the offload sections (tiers from DeepSpeed's
// device strings), MiCS (parallel.data_shard_size) and the accepted-only keys.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param = OffloadConfig::ForParams();
  bool stage3_gather_16bit_weights_on_model_save = false;
  int mics_shard_size = -1;  // DeepSpeed's MiCS: parallel.data_shard_size at stage 3; <= 0: off
};

// fp16's keys that map: enabled (the compute dtype) and loss_scale (0: dynamic, else static).
// Its others bind to RunConfig::manager.loss_scale.
struct Fp16Config {
  bool enabled = false;
  float loss_scale = 0.0f;
};

// The optimizer's keys that map (type and adam_w_mode: OptimizerKind; betas: beta1 and beta2),
// the learning rate (the schedule's, per step) and the accepted-only keys. Its other parameters
// bind to RunConfig::manager.optimizer.
struct OptimizerConfig {
  std::string type = "AdamW";
  float lr = 3e-4f;
  std::array<float, 2> betas = {RuntimeDefaults().optimizer.beta1,
                                RuntimeDefaults().optimizer.beta2};
  bool adam_w_mode = true;
  bool cuda_aware = false;
  std::string comm_backend_name = "nccl";
};

struct SchedulerConfig {
  std::string type;
  float warmup_min_lr = 0.0f;
  float warmup_max_lr = 0.001f;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  int64_t total_num_steps = 0;
  float warmup_min_ratio = 0.0f;
  float cos_min_ratio = 0.0001f;
};

struct ModelConfig {
  DecoderConfig shape;    // model.arch, model.rope_scaling and the shape keys bind to it
  std::string init_from;  // a Hugging Face model directory: the initial weights
  bool activation_checkpointing = false;
  int64_t head_chunk_rows = 0;
  // The attention program on CUDA: flash or materialised; empty: by shape (AttentionBackendNamed,
  // kernels/memory_facts.h).
  std::string attention_backend;
  // The CUDA flash kernels' block shapes (model.flash_attention; 0: the head size's default).
  FlashTiles flash_attention;
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t eval_interval = 0;
  int eval_windows = 8;
  int sample_tokens = 64;
  std::string sample_prompt = "\n";
  float sample_temperature = 0.8f;
  int sample_top_k = 40;
  std::string device;
  int64_t async_jitter_seed = 0;  // cpu-async: StreamOptions::jitter_seed
  int async_jitter_max_us = 100;
  bool check_memory = true;
  // false: ShardManagerOptions::overlap_host_step kOff ([Note: the host step behind the
  // forward]); true leaves the manager's own (kAuto unless RunConfig::manager says otherwise).
  bool overlap_host_step = true;
  // OffloadOptions::device_grad_sums ([Note: gradient sums on the device], sharding/options.h).
  bool device_grad_sums = false;
  // MFU's denominator, TFLOP/s a device; 0: the GPU's dense bf16 peak by its name
  // (DenseBf16PeakFlops, runtime/device.h), none on the CPU or an unknown GPU.
  double peak_tflops = 0;
};

struct CheckpointConfig {
  std::string dir;
  int64_t interval = 0;
  int keep_last_n = 2;
};

struct LoggingConfig {
  std::string metrics_file;
  std::string level = "info";
  std::string trace_file;
};

struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
  std::string Dir() const { return output_path.empty() ? job_name : output_path + "/" + job_name; }
};

struct ParallelConfig {
  int tensor_parallel_size = 1;
  bool sequence_parallel = false;
  int make_vocab_size_divisible_by = 1;
  int pipeline_parallel_size = 1;
  std::string pipeline_schedule = "1f1b";
  int virtual_pipeline_stages = 1;
  std::vector<int> pipeline_layers;
  bool pipeline_scatter_gather = true;
  double collective_timeout_s = 600;
  // [Note: hybrid sharding] (runtime/device_mesh.h): HSDP's shard group size; 0: the state is
  // sharded over the whole data-parallel group.
  int data_shard_size = 0;
};

// Every integer key's ceiling: 2^53, the largest integer a JSON number holds exactly.
inline constexpr int64_t kMaxConfigInt = int64_t{1} << 53;
inline constexpr double kMaxConfigIntAsDouble = static_cast<double>(kMaxConfigInt);

struct RunConfig {
  // DeepSpeed's batch triple; 0 means "not given" (ResolveBatch fills it).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  // [Note: a key is its option] The shard manager's options, the very struct the runtime takes:
  // a key that sets one of its members one to one (zero_optimization's buckets, thresholds and
  // ZeRO++ switches, aio, the optimizer's parameters, fp16's scaler, gradient_clipping) is a
  // field-table row bound to that member (config_rows.cc), with the member's default and doc
  // in sharding/options.h, and nothing copies it. The members no key sets one to one (the stage,
  // the dtypes, the tiers, the optimizer kind, the loss scale's mode, the predivide factor)
  // ShardManagerOptionsFrom maps from the sections below (config/run_options.cc).
  ShardManagerOptions manager;
  ZeroConfig zero;
  Fp16Config fp16;
  bool bf16 = false;  // bf16.enabled
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  bool prescale_gradients = false;
  double gradient_predivide_factor = RuntimeDefaults().gradient_predivide_factor;
  bool wall_clock_breakdown = false;
  int64_t steps_per_print = 10;
  uint64_t seed = RuntimeDefaults().seed;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  CsvMonitorConfig csv_monitor;
  ParallelConfig parallel;

  // What reading the config decided that a user should see once (accepted DeepSpeed keys, other
  // names, resolved "auto" values): logged at the start of a run and by --print-config.
  std::vector<std::string> notes;
  // What reading the config ignored or accepted although it is probably a mistake (offload_param
  // below stage 3, fp16.min_loss_scale below 1): logged as warnings at the start of a run and by
  // --print-config.
  std::vector<std::string> warnings;

  // The resolved config as JSON (every field, defaults included): --print-config and metadata.
  nlohmann::json ToJson() const;
};

// Reads and validates a config. `overrides` are "path.to.key=value" strings (--set), applied to
// the JSON before validation; a value is parsed as JSON when it can be, else taken as a string.
StatusOr<RunConfig> LoadRunConfig(const std::string& file,
                                  const std::vector<std::string>& overrides = {});
StatusOr<RunConfig> ParseRunConfig(const nlohmann::json& json, const std::string& file);

// Resolves the batch triple for `dp_size` data-parallel ranks (`dp_source` says where that
// number came from, for the message): fills the missing member(s) or fails showing the numbers.
Status ResolveBatch(RunConfig& config, int dp_size, const std::string& dp_source);

}  // namespace zerort
