// RunConfig: the schema of a `zerort train` config, one typed struct per section. Keys follow
// DeepSpeed's names where DeepSpeed has them (its top-level batch keys, zero_optimization, fp16,
// bf16, optimizer, scheduler, gradient_clipping, steps_per_print), so a ds_config.json section can
// be pasted in; zerort's own sections are model, data, train, checkpoint, logging, parallel.
// Every field says its default and why. LoadRunConfig is strict (json_reader.h): unknown keys,
// wrong types, out-of-range values and duplicates are refused naming the JSON path, all of a
// config's problems in one message; DeepSpeed's other keys, names and "auto" values go through
// engine/deepspeed_config.h first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layers/gpt_config.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

namespace zerort {

struct OffloadConfig {
  std::string device =
      "none";              // none | cpu | nvme: where the buffers go; none keeps them on device
  std::string nvme_path;   // directory of the NVMe store (device nvme only)
  bool pin_memory = true;  // page-locked host buffers: DeepSpeed's default, faster copies
  int buffer_count = 4;    // staging buffers in flight: DeepSpeed's 4 (optimizer), 5 (param)
  int64_t buffer_size = 100'000'000;   // offload_param: elements per fetch buffer, DeepSpeed's
  int64_t max_in_cpu = 1'000'000'000;  // offload_param: accepted; zerort keeps no host cache
  double ratio = 1.0;                  // offload_optimizer: only 1 (the whole state) is supported
};

// DeepSpeed's "aio" section: how the NVMe tier does its I/O.
struct AioConfig {
  int64_t block_size = 1 << 20;  // bytes per request, DeepSpeed's default (multiple of 4096)
  int queue_depth = 8;           // requests in flight, DeepSpeed's default
  int thread_count = 1;          // pread/pwrite threads when io_uring is refused, DeepSpeed's
  bool single_submit = false;    // submit requests one at a time, DeepSpeed's default
  bool overlap_events = true;    // refill the queue as requests complete, DeepSpeed's default
  std::string engine = "auto";   // zerort's: auto | io_uring | threads (force the fallback)
};

struct ZeroConfig {
  int stage = 0;             // DeepSpeed's default: plain data parallelism
  bool overlap_comm = true;  // reduce gradients on the comm stream during the backward
  int64_t reduce_bucket_size = 500'000'000;              // elements, DeepSpeed's default
  int64_t stage3_prefetch_bucket_size = 50'000'000;      // elements issued ahead, DeepSpeed's
  int64_t stage3_param_persistence_threshold = 100'000;  // smaller units stay gathered
  int64_t stage3_max_live_parameters = 1'000'000'000;    // elements gathered at once
  // Stage 3: a unit reused within this many elements of other units stays gathered. zerort's
  // default 0 releases after every use; DeepSpeed's is 1e9 (ShardManagerOptions).
  int64_t stage3_max_reuse_distance = 0;
  int64_t allgather_bucket_size = 500'000'000;  // stages 1-2: elements per parameter all-gather
  bool contiguous_gradients = true;  // accepted for DeepSpeed compatibility; always contiguous
  bool allgather_partitions = true;  // false: a broadcast per rank instead of one all-gather
  bool reduce_scatter = true;        // false: stages 2-3 all-reduce, each rank keeps its shard
  OffloadConfig offload_optimizer;   // master weights, optimizer state and gradient shards
  OffloadConfig offload_param;       // stage-3 compute shards
  int64_t sub_group_size = 1'000'000'000;  // elements per optimizer chunk, DeepSpeed's default
  // At each checkpoint save, rank 0 also writes the consolidated weights in the compute dtype
  // (bf16/fp16; fp32 runs fp32) as a Hugging Face model in step_<N>/hf/ (DeepSpeed's 16-bit save).
  bool stage3_gather_16bit_weights_on_model_save = false;
};

struct Fp16Config {
  bool enabled = false;          // fp16 compute with dynamic loss scaling
  float loss_scale = 0.0f;       // 0: dynamic (DeepSpeed's convention)
  int initial_scale_power = 16;  // dynamic scale starts at 2^16, DeepSpeed's default
  int loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  int hysteresis = 2;            // overflows tolerated before the scale halves
  float min_loss_scale = 1.0f;   // the scale never goes below this
};

struct OptimizerConfig {
  std::string type = "AdamW";   // AdamW | Adam | SGD | Lamb
  float lr = 3e-4f;             // a common GPT-2-small rate; overridden by a scheduler
  float beta1 = 0.9f;           // params.betas[0]
  float beta2 = 0.999f;         // params.betas[1], PyTorch's default
  float eps = 1e-8f;            // PyTorch's default
  float weight_decay = 0.0f;    // PyTorch's Adam default (AdamW users set 0.1 for GPT-2)
  bool adam_w_mode = true;      // Adam only: decoupled decay, DeepSpeed's FusedAdam default
  bool bias_correction = true;  // Adam(W): Adam's 1/(1-beta^t) terms, DeepSpeed's default
  float momentum = 0.0f;        // SGD
  float dampening = 0.0f;       // SGD
  bool nesterov = false;        // SGD
  float max_coeff = 10.0f;      // Lamb: the trust ratio's clamp, DeepSpeed's defaults
  float min_coeff = 0.01f;
};

struct SchedulerConfig {
  std::string type;                 // "" (constant lr) | WarmupLR | WarmupDecayLR | WarmupCosineLR
  float warmup_min_lr = 0.0f;       // WarmupLR/WarmupDecayLR: lr at step 0
  float warmup_max_lr = 0.001f;     // WarmupLR/WarmupDecayLR: lr after warm-up (DeepSpeed's)
  int64_t warmup_num_steps = 1000;  // DeepSpeed's default
  std::string warmup_type = "log";  // log | linear, DeepSpeed's default log
  int64_t total_num_steps = 0;      // WarmupDecayLR/WarmupCosineLR: required
  float warmup_min_ratio = 0.0f;    // WarmupCosineLR: lr ratio at step 0
  float cos_min_ratio = 0.0001f;    // WarmupCosineLR: final ratio, DeepSpeed's default
};

struct ModelConfig {
  GptConfig shape;                        // from "preset" and/or the five shape keys
  bool activation_checkpointing = false;  // recompute blocks in the backward: off, it costs time
  int64_t head_chunk_rows = 0;  // rows of the head's logits at a time; 0: automatic (2 d_model)
};

struct DataConfig {
  std::string path;                   // token file (zerort data prepare); "" -> the built-in corpus
  double validation_fraction = 0.05;  // the file's tail held out for evaluation
};

struct TrainConfig {
  int64_t steps = 100;               // optimizer steps of the run
  int64_t eval_interval = 0;         // evaluate every N steps; 0: only at the end
  int eval_windows = 8;              // validation windows per evaluation (per run, not per rank)
  int sample_tokens = 64;            // text sampled at the end; 0: none
  std::string sample_prompt = "\n";  // the sample's prompt (bytes)
  float sample_temperature = 0.8f;   // 0: greedy; below 1 sharpens a small model's text
  int sample_top_k = 40;             // 0: the whole vocabulary
  std::string device;                // cpu | cuda; "" -> cuda when a GPU is present, else cpu
  // Before allocating, compare the memory estimator's peak for this rank with the memory it can
  // use (the GPU's, or the host's available memory and cgroup limit shared by the node's ranks)
  // and refuse a run that cannot fit (exit 2) instead of being OOM-killed.
  bool check_memory = true;
};

struct CheckpointConfig {
  std::string dir;       // "" -> no checkpoints
  int64_t interval = 0;  // save every N steps; 0: only at the end and on signals
  int keep_last_n = 2;   // older step directories are removed; 0 keeps all
};

struct LoggingConfig {
  std::string metrics_file;  // "" -> <checkpoint.dir>/metrics.jsonl, or none without a dir
  std::string level = "info";
  std::string trace_file;  // Chrome trace-event JSON of every rank's work; "" -> none
};

// DeepSpeed's csv_monitor: rank 0 writes loss, learning rate, loss scale (fp16), validation loss
// and tokens/s to CSV files in <output_path>/<job_name>/ (engine/csv_monitor.h).
struct CsvMonitorConfig {
  bool enabled = false;
  std::string output_path;                    // "": the working directory, as DeepSpeed's ""
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
  std::string Dir() const { return output_path.empty() ? job_name : output_path + "/" + job_name; }
};

struct ParallelConfig {
  // Megatron-style tensor and pipeline parallelism: the world is data x tensor x pipeline
  // (tensor fastest), the data-parallel size world / (tensor_parallel_size x
  // pipeline_parallel_size); n_head and d_model must divide.
  int tensor_parallel_size = 1;
  bool sequence_parallel = false;        // split LayerNorms and the residual stream by rows too
  int make_vocab_size_divisible_by = 1;  // wte padded to a multiple of this x tensor size
  int pipeline_parallel_size = 1;        // stages; the world is data x tensor x pipeline
  // gpipe | 1f1b | interleaved; model chunks per stage (interleaved: >= 2); blocks per chunk
  // (pipeline_parallel_size x virtual_pipeline_stages numbers summing to model.n_layer; empty:
  // an even split). The micro-batches per step (gradient_accumulation_steps) are the schedule's.
  std::string pipeline_schedule = "1f1b";
  int virtual_pipeline_stages = 1;
  std::vector<int> pipeline_layers;
  // Megatron's scatter/gather of cross-stage sends: each tensor-parallel rank sends 1/tp of a
  // boundary activation, the next stage all-gathers it (tp-fold fewer bytes between stages).
  bool pipeline_scatter_gather = true;
  // Seconds any collective or point-to-point transfer may wait for its peers before the watchdog
  // stops every rank with exit code 3 and each rank's last collectives (a rank that died or
  // skipped a send).
  double collective_timeout_s = 600;
};

struct RunConfig {
  // DeepSpeed's batch triple: train_batch_size = micro x accumulation x data-parallel size.
  // Any two determine the third; 0 means "not given".
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  ZeroConfig zero;
  AioConfig aio;
  Fp16Config fp16;
  bool bf16 = false;  // bf16.enabled: bf16 compute, fp32 masters and reduction
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  float gradient_clipping = 0.0f;  // max global norm; 0: off (DeepSpeed's default)
  // Where the data-parallel mean divides (DeepSpeed's keys; the same mean up to rounding):
  // prescale_gradients divides by the data-parallel size before the reduction;
  // gradient_predivide_factor f divides by f before and by (size / f) after (ignored with
  // prescale_gradients, as DeepSpeed ignores it). Default: after.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // Seconds per phase (forward, backward, reduce, optimizer, gather) in the metrics.
  bool wall_clock_breakdown = false;
  int64_t steps_per_print = 10;  // DeepSpeed's default
  uint64_t seed = 1234;          // initialisation and data order
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
