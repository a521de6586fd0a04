// The DeepSpeed key list and the config front end: legacy and alternative names, accepted and
// refused keys, "auto" values.
#include "engine/deepspeed_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "engine/config.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

constexpr DsHandling I = DsHandling::kImplemented;
constexpr DsHandling M = DsHandling::kMapped;
constexpr DsHandling A = DsHandling::kAccepted;
constexpr DsHandling R = DsHandling::kRefused;

// Every key DeepSpeed documents (docs/_pages/config-json.md, deepspeed/runtime/constants.py and
// zero/config.py, checked against DeepSpeed at commit edaa722, 2026-08). Sections whose keys are
// all handled the same way are one row. Order: as the README table reads.
constexpr DsKey kKeys[] = {
    // Batch.
    {"train_batch_size", I, "global batch = micro x accumulation x data-parallel size", "8"},
    {"train_micro_batch_size_per_gpu", I, "sequences per rank per micro-batch", "2"},
    {"gradient_accumulation_steps", I, "micro-batches per step (a pipeline's micro-batches)", "2"},
    {"managed_gradient_accumulation", A, "zerort's step always runs its own accumulation", "true"},
    // Optimizer and scheduler.
    {"optimizer.type", I,
     "AdamW, Adam, SGD (torch.optim's), Lamb (per-parameter trust ratios over shards); "
     "OneBitAdam, OneBitLamb, ZeroOneAdam are refused by name, other types as not one of these",
     "\"AdamW\""},
    {"optimizer.params.lr", I, "learning rate (a scheduler's warmup_max_lr overrides it)", "0.001"},
    {"optimizer.params.betas", I, "Adam(W) moments' decay", "[0.9, 0.95]"},
    {"optimizer.params.eps", I, "Adam(W) denominator term", "1e-8"},
    {"optimizer.params.weight_decay", I, "decoupled (AdamW) or L2 (Adam, SGD)", "0.1"},
    {"optimizer.params.adam_w_mode", I, "Adam: decoupled decay (DeepSpeed's FusedAdam default)",
     "true"},
    {"optimizer.params.bias_correction", I, "Adam(W): false drops Adam's 1/(1-beta^t) terms",
     "false"},
    {"optimizer.params.torch_adam", A,
     "zerort's fused kernel computes torch.optim.Adam(W)'s update in its order of operations",
     "true"},
    {"optimizer.params.amsgrad", R, "AMSGrad's running maximum is not implemented", "true",
     "false"},
    {"optimizer.params.momentum", I, "SGD momentum (torch.optim.SGD)", "0.9"},
    {"optimizer.params.dampening", I, "SGD dampening", "0"},
    {"optimizer.params.nesterov", I, "SGD Nesterov momentum", "false"},
    {"optimizer.params.freeze_step", R,
     "a 1-bit optimizer's parameter (1-bit optimizers are not "
     "implemented: their compressed all-reduce changes the gradients)",
     "100"},
    {"optimizer.params.cuda_aware", R, "a 1-bit optimizer's parameter", "false"},
    {"optimizer.params.var_freeze_step", R, "a 0/1 Adam parameter", "100"},
    {"optimizer.params.var_update_scaler", R, "a 0/1 Adam parameter", "16"},
    {"optimizer.params.local_step_scaler", R, "a 0/1 Adam parameter", "32678"},
    {"optimizer.params.local_step_clipper", R, "a 0/1 Adam parameter", "16"},
    {"optimizer.params.coeff_beta", R, "a 1-bit LAMB parameter", "0.9"},
    {"optimizer.params.factor_max", R, "a 1-bit LAMB parameter", "4.0"},
    {"optimizer.params.factor_min", R, "a 1-bit LAMB parameter", "0.5"},
    {"optimizer.params.factor_threshold", R, "a 1-bit LAMB parameter", "0.1"},
    {"optimizer.params.comm_backend_name", R, "a 1-bit optimizer's parameter", "\"nccl\""},
    {"optimizer.params.max_coeff", I, "LAMB: the trust ratio's upper clamp (10)", "10.0"},
    {"optimizer.params.min_coeff", I, "LAMB: the trust ratio's lower clamp (0.01)", "0.01"},
    {"optimizer.params.max_grad_norm", R,
     "DeepSpeed's engine refuses it too ('max_grad_norm' is not supported as an optimizer "
     "parameter): use gradient_clipping",
     "1.0", "[0, 0.0]"},
    {"optimizer.legacy_fusion", A, "zerort has one fused optimizer kernel per device", "false"},
    {"scheduler.type", I,
     "WarmupLR, WarmupDecayLR, WarmupCosineLR; OneCycle and LRRangeTest are refused by name",
     "\"WarmupLR\""},
    {"scheduler.params.warmup_min_lr", I, "WarmupLR/WarmupDecayLR: lr at step 0", "0"},
    {"scheduler.params.warmup_max_lr", I, "WarmupLR/WarmupDecayLR: lr after warm-up", "0.001"},
    {"scheduler.params.warmup_num_steps", I, "warm-up steps", "10"},
    {"scheduler.params.warmup_type", I, "log or linear warm-up", "\"linear\""},
    {"scheduler.params.total_num_steps", I, "WarmupDecayLR/WarmupCosineLR: the decay's end", "100"},
    {"scheduler.params.warmup_min_ratio", I, "WarmupCosineLR: lr ratio at step 0", "0"},
    {"scheduler.params.cos_min_ratio", I, "WarmupCosineLR: final lr ratio", "0.0001"},
    // Communication.
    {"communication_data_type", R,
     "zerort reduces gradients in fp32; a 16-bit reduction changes the gradients", "\"fp16\"",
     "[\"fp32\", null]"},
    {"seq_parallel_communication_data_type", R,
     "under sequence parallelism DeepSpeed reduces gradients in this dtype; zerort reduces "
     "every gradient in fp32, and a 16-bit reduction changes the gradients",
     "\"bf16\"", "[\"fp32\", null]"},
    {"gradient_allreduce_op", R,
     "zerort averages gradients; a sum multiplies them by the world size", "\"sum\"", "[\"mean\"]"},
    {"prescale_gradients", I,
     "divide gradients by the data-parallel size before the reduction, not after", "true"},
    {"gradient_predivide_factor", I,
     "divide gradients by this before the reduction and by (data-parallel size / factor) after",
     "2.0"},
    {"sparse_gradients", A, "zerort reduces the embedding's gradient dense (the same numbers)",
     "true"},
    {"disable_allgather", A, "zerort all-gathers each unit's shards", "true"},
    {"fp32_allreduce", A, "zerort reduces gradients in fp32 already", "true"},
    // Precision.
    {"fp16.enabled", I,
     "fp16 weights and activations, fp32 math, masters and reduction, dynamic loss scaling "
     "(skipped steps and the scale in the metrics)",
     "true"},
    {"fp16.auto_cast", A, "zerort's model casts its own inputs to the compute dtype", "true"},
    {"fp16.loss_scale", I, "0: dynamic loss scaling, else a static scale", "0"},
    {"fp16.initial_scale_power", I, "dynamic scale starts at 2^this", "16"},
    {"fp16.loss_scale_window", I, "overflow-free steps before the scale doubles", "1000"},
    {"fp16.hysteresis", I, "overflows tolerated before the scale halves", "2"},
    {"fp16.consecutive_hysteresis", R, "refilling hysteresis after good steps is not implemented",
     "true", "[false]"},
    {"fp16.min_loss_scale", I,
     "the scale's floor (below 1: a warning; newer DeepSpeed takes an integer here)", "1"},
    {"fp16.fp16_master_weights_and_grads", R, "zerort keeps fp32 master weights and gradients",
     "true", "[false]"},
    {"bf16.enabled", I, "bf16 compute, fp32 master weights and reduction", "true"},
    {"bf16.immediate_grad_update", A,
     "zerort accumulates each reduced gradient into its fp32 shard as it arrives", "true"},
    {"bf16.check_grad_overflow", A, "zerort checks every step's gradients for inf/NaN", "true"},
    {"bf16.bf16_master_weights_and_grads", R, "zerort keeps fp32 master weights and gradients",
     "true", "[false]"},
    {"bf16.bf16_optimizer_states", R, "zerort keeps fp32 optimizer state", "true", "[false]"},
    {"bfloat16", M, "bf16", "{\"enabled\": true}"},
    {"amp", R, "NVIDIA Apex AMP: use bf16.enabled", "{\"enabled\": true}", "disabled"},
    {"torch_autocast", R, "torch.autocast regions: use bf16.enabled", "{\"enabled\": true}",
     "disabled"},
    {"gradient_clipping", I, "max global L2 norm of the gradient; 0: off", "1.0"},
    // ZeRO.
    {"zero_optimization", M,
     "{\"stage\": 1} for true, {\"stage\": 0} for false (DeepSpeed's legacy "
     "boolean form)",
     "true"},
    {"zero_optimization.stage", I, "0-3: what each rank keeps (README, ZeRO stages)", "2"},
    {"zero_optimization.overlap_comm", I, "reduce on the comm stream during the backward", "true"},
    {"zero_optimization.reduce_bucket_size", I,
     "elements per gradient reduction; 0: each unit alone", "5e8"},
    {"zero_optimization.contiguous_gradients", I, "always contiguous (one flat buffer per unit)",
     "true"},
    {"zero_optimization.sub_group_size", I,
     "elements per optimizer chunk of the NVMe tier; 0 (DeepSpeed: a sub-group per parameter): "
     "one chunk per unit's shard",
     "1e9"},
    {"zero_optimization.stage3_prefetch_bucket_size", I, "elements gathered ahead; 0: no prefetch",
     "5e7"},
    {"zero_optimization.stage3_param_persistence_threshold", I,
     "units below this many elements stay gathered", "1e5"},
    {"zero_optimization.stage3_max_live_parameters", I,
     "elements gathered at once; 0: only the unit in use", "1e9"},
    {"zero_optimization.offload_optimizer", I, "device none | cpu | nvme (README, Offload)",
     "{\"device\": \"cpu\"}"},
    {"zero_optimization.offload_param", I,
     "stage 3: device none | cpu | nvme; below stage 3 ignored with a warning, as DeepSpeed "
     "ignores it",
     "{\"device\": \"none\"}"},
    {"zero_optimization.allgather_partitions", I,
     "false gathers each unit's shards by one broadcast per rank instead of one all-gather (the "
     "same weights)",
     "false"},
    {"zero_optimization.allgather_bucket_size", I,
     "stages 1-2: elements per all-gather of the updated parameters (world x piece); a larger "
     "unit goes in pieces through a staging buffer of that size",
     "5e8"},
    {"zero_optimization.reduce_scatter", I,
     "false reduces stage 2-3 gradients by an all-reduce, each rank keeping its shard (the same "
     "numbers); stages 0-1 always all-reduce",
     "false"},
    {"zero_optimization.round_robin_gradients", A,
     "already how zerort splits gradients: every unit's gradient is sharded over all ranks, so "
     "each rank copies 1/N of every unit as the backward ends it (DeepSpeed's round robin "
     "balances whole tensors over ranks to get there)",
     "true"},
    {"zero_optimization.stage3_max_reuse_distance", I,
     "stage 3: a unit used again within this many elements of other units stays gathered "
     "(within stage3_max_live_parameters); zerort's default 0 releases after every use, "
     "DeepSpeed's is 1e9",
     "1e9"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", I,
     "at each checkpoint save rank 0 also writes the consolidated weights in the compute dtype "
     "as a Hugging Face model in step_N/hf/ (without checkpoint.dir, nothing is saved)",
     "true"},
    {"zero_optimization.stage3_model_persistence_threshold", A,
     "persistent units are bounded by stage3_param_persistence_threshold only", "1e9"},
    {"zero_optimization.stage3_module_granularity_threshold", A, "zerort's units are its blocks",
     "0"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", A, "zerort all-gathers parameters",
     "true"},
    {"zero_optimization.stage3_allgather_sequential", A, "zerort gathers one unit at a time",
     "true"},
    {"zero_optimization.load_from_fp32_weights", A, "zerort's checkpoints restore fp32 masters",
     "true"},
    {"zero_optimization.elastic_checkpoint", A, "zerort's checkpoints load at any world size",
     "true"},
    {"zero_optimization.grad_hooks", A, "zerort's units reduce as their backward ends", "true"},
    {"zero_optimization.use_multi_rank_bucket_allreduce", A, "zerort's buckets are per stage",
     "true"},
    {"zero_optimization.ignore_unused_parameters", A, "every parameter of zerort's model is used",
     "true"},
    {"zero_optimization.legacy_stage1", A, "zerort has one stage-1 implementation", "false"},
    {"zero_optimization.memory_efficient_linear", A, "zerort's linear layers keep no extra copy",
     "true"},
    {"zero_optimization.log_trace_cache_warnings", A, "zerort records the order units are used",
     "false"},
    {"zero_optimization.pipeline_loading_checkpoint", A, "zerort loads checkpoints per unit",
     "false"},
    {"zero_optimization.override_module_apply", A, "zerort's model is not a torch module", "true"},
    {"zero_optimization.enable_sanity_checks", A, "zerort's shard states are always checked",
     "true"},
    {"zero_optimization.leaf_module", A, "zerort's units are its blocks", "{}"},
    {"zero_optimization.zero_hpz_partition_size", A,
     "zerort keeps one secondary copy: none (ZeRO++ hpZ trades memory for inter-node traffic)",
     "8"},
    {"zero_optimization.mics_shard_size", A,
     "zerort shards over the whole data-parallel group (MiCS's sub-groups are not implemented)",
     "8"},
    {"zero_optimization.mics_hierarchical_params_gather", A, "see mics_shard_size", "true"},
    {"zero_optimization.zero_quantized_weights", R,
     "ZeRO++ quantized weight gathers change the weights the model sees", "true", "[false]"},
    {"zero_optimization.zero_quantized_nontrainable_weights", R,
     "quantized weights change the numbers", "true", "[false]"},
    {"zero_optimization.zero_quantized_gradients", R,
     "ZeRO++ quantized gradient reduction changes the gradients", "true", "[false]"},
    {"zero_optimization.zeropp_loco_param", R, "LoCo error feedback changes the gradients",
     "{\"err_beta\": 0.8}"},
    {"zero_optimization.zenflow", R, "ZenFlow's stale updates change the numbers",
     "{\"topk_ratio\": 0.1}"},
    {"zero_optimization.save_muon_momentum_buffer_in_memory", A,
     "Muon is not an optimizer of "
     "zerort's",
     "false"},
    {"zero_optimization.cpu_offload", M, "zero_optimization.offload_optimizer.device \"cpu\"",
     "true"},
    {"zero_optimization.cpu_offload_param", M, "zero_optimization.offload_param.device \"cpu\"",
     "true"},
    {"zero_optimization.cpu_offload_params", M, "zero_optimization.offload_param.device \"cpu\"",
     "true"},
    {"zero_optimization.cpu_offload_use_pin_memory", M,
     "pin_memory of zero_optimization.offload_optimizer and offload_param", "true"},
    {"zero_optimization.max_live_parameters", M, "zero_optimization.stage3_max_live_parameters",
     "1e9"},
    {"zero_optimization.max_reuse_distance", M, "zero_optimization.stage3_max_reuse_distance",
     "1e9"},
    {"zero_optimization.prefetch_bucket_size", M, "zero_optimization.stage3_prefetch_bucket_size",
     "5e7"},
    {"zero_optimization.param_persistence_threshold", M,
     "zero_optimization.stage3_param_persistence_threshold", "1e5"},
    {"zero_optimization.model_persistence_threshold", M,
     "zero_optimization.stage3_model_persistence_threshold", "1e9"},
    {"zero_optimization.module_granularity_threshold", M,
     "zero_optimization.stage3_module_granularity_threshold", "0"},
    {"zero_optimization.use_all_reduce_for_fetch_params", M,
     "zero_optimization.stage3_use_all_reduce_for_fetch_params", "false"},
    {"zero_optimization.allgather_sequential", M, "zero_optimization.stage3_allgather_sequential",
     "false"},
    {"zero_optimization.gather_16bit_weights_on_model_save", M,
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", "true"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", M,
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", "true"},
    {"zero_optimization.offload_optimizer.ratio", R,
     "partial optimizer offload (ZeRO++ twin-flow) is not implemented: zerort offloads all of "
     "the optimizer state",
     "0.3", "[1, 1.0]"},
    {"zero_optimization.offload_optimizer.pipeline_read", A,
     "zerort's NVMe tier always overlaps reads with the step", "true"},
    {"zero_optimization.offload_optimizer.pipeline_write", A,
     "zerort's NVMe tier always overlaps writes with the step", "true"},
    {"zero_optimization.offload_optimizer.fast_init", A, "zerort initialises shards in place",
     "true"},
    {"zero_optimization.offload_optimizer.super_offload", A,
     "zerort's offloaded step is its own CPU optimizer", "false"},
    {"zero_optimization.offload_optimizer.cpuadam_cores_perc", A,
     "the CPU optimizer uses the OpenMP threads given to the process", "0.8"},
    // Asynchronous I/O.
    {"aio.block_size", I, "bytes per NVMe request", "1048576"},
    {"aio.queue_depth", I, "NVMe requests in flight", "8"},
    {"aio.thread_count", I, "pread/pwrite threads when io_uring is refused", "1"},
    {"aio.intra_op_parallelism", M, "aio.thread_count", "1"},
    {"aio.single_submit", I, "submit NVMe requests one at a time", "false"},
    {"aio.overlap_events", I, "refill the queue as requests complete", "true"},
    {"aio.use_gds", A,
     "GPUDirect Storage is not implemented: zerort stages NVMe I/O through "
     "pinned host memory",
     "true"},
    // Parallelism.
    {"tensor_parallel.autotp_size", M, "parallel.tensor_parallel_size", "1"},
    {"tensor_parallel", A,
     "zerort's model splits itself Megatron-style (parallel.tensor_parallel_size); AutoTP's "
     "module patterns are not needed",
     "{\"tp_overlap_comm\": false}"},
    {"pipeline", A,
     "zerort's pipeline is parallel.pipeline_parallel_size and parallel.pipeline_schedule",
     "{\"activation_checkpoint_interval\": 0}"},
    {"expert_parallel", R, "zerort's model has no experts", "{\"enabled\": true}", "disabled"},
    {"use_data_before_expert_parallelism", A, "zerort's model has no experts", "false"},
    {"sequence_parallel_size", R,
     "DeepSpeed-Ulysses is not implemented (zerort's sequence "
     "parallelism is parallel.sequence_parallel, Megatron's)",
     "2", "[1]"},
    // Logging and observing.
    {"steps_per_print", I, "steps between metrics lines", "10"},
    {"wall_clock_breakdown", I,
     "forward, backward, reduce, optimizer and gather seconds in the metrics line and "
     "metrics.jsonl",
     "true"},
    {"dump_state", A, "`zerort train --print-config` prints the resolved config", "true"},
    {"memory_breakdown", A, "the metrics line has peak memory by category every step", "true"},
    {"flops_profiler", A, "the metrics line has TFLOP/s and MFU by the PaLM formula",
     "{\"enabled\": true}"},
    {"comms_logger", A,
     "zerort keeps no per-collective log yet: logging.trace_file has each rank's forward + "
     "backward, optimizer step, evaluation and checkpoint saves (a pipeline stage's sends and "
     "receives too), and a collective that hangs past parallel.collective_timeout_s is reported "
     "with every rank's last collectives",
     "{\"enabled\": true}"},
    {"timers", A, "the metrics line has the step time and tokens/s", "{\"throughput\": {}}"},
    {"tensorboard", R,
     "TensorBoard event files cannot be written (Debian has no library that writes them): use "
     "csv_monitor (DeepSpeed's CSV files) or metrics.jsonl with `zerort plot`",
     "{\"enabled\": true, \"output_path\": \"tb\"}", "disabled"},
    {"csv_monitor", I,
     "rank 0 writes DeepSpeed's CSV files (train_loss, lr, loss_scale with fp16; zerort's "
     "val_loss and tokens_per_s) to output_path/job_name",
     "{\"enabled\": false, \"output_path\": \"csv\"}"},
    {"wandb", A, "zerort writes metrics.jsonl; nothing is sent to Weights & Biases",
     "{\"enabled\": true}"},
    {"comet", A, "zerort writes metrics.jsonl; nothing is sent to Comet", "{\"enabled\": true}"},
    {"autotuning", A, "zerort does not autotune: `zerort estimate` compares layouts",
     "{\"enabled\": true}"},
    // Activation checkpointing.
    {"activation_checkpointing", M,
     "model.activation_checkpointing = true (every block recomputed in the backward); its keys "
     "partition_activations, cpu_checkpointing, contiguous_memory_optimization, "
     "number_checkpoints, synchronize_checkpoint_boundary and profile are accepted",
     "{\"partition_activations\": false}"},
    // Checkpoints and data.
    {"checkpoint.tag_validation", A, "zerort's checkpoints carry their run id and checksums",
     "\"Warn\""},
    {"checkpoint.load_universal", A, "zerort's checkpoints load at any layout", "true"},
    {"checkpoint.use_node_local_storage", A, "every rank writes its own file", "true"},
    {"checkpoint.parallel_write", A, "every rank writes its own file",
     "{\"pipeline_stage\": true}"},
    {"nebula", A, "zerort writes its own checkpoints (checkpoint.dir)", "{\"enabled\": true}"},
    {"datastates", A, "zerort writes its own checkpoints (checkpoint.dir)", "{\"enabled\": true}"},
    {"dataloader_drop_last", A, "zerort's loader reads whole sequences only", "true"},
    {"data_types.grad_accum_dtype", R, "zerort accumulates gradients in fp32", "\"bf16\"",
     "[\"fp32\", null]"},
    {"data_types.param_dtype", R, "zerort's parameters are the compute dtype (bf16.enabled)",
     "\"bf16\"", "[\"fp32\", null]"},
    {"data_types.buffer_dtype", R, "zerort keeps buffers in fp32", "\"bf16\"", "[\"fp32\", null]"},
    // Training techniques that change the numbers.
    {"sparse_attention", R, "sparse attention changes the model", "{\"mode\": \"fixed\"}"},
    {"data_efficiency", R, "data sampling and routing change the data", "{\"enabled\": true}",
     "disabled"},
    {"curriculum_learning", R, "a curriculum changes the data", "{\"enabled\": true}", "disabled"},
    {"compression_training", R, "quantization and pruning change the model",
     "{\"weight_quantization\": {\"shared_parameters\": {\"enabled\": true}}}", "disabled"},
    {"weight_quantization", R, "quantized weights change the model",
     "{\"quantized_initialization\": {}}"},
    {"progressive_layer_drop", R, "dropping layers changes the model", "{\"enabled\": true}",
     "disabled"},
    {"eigenvalue", R, "the eigenvalue schedule drives quantization", "{\"enabled\": true}",
     "disabled"},
    {"quantize_training", R, "quantized training changes the model", "{\"enabled\": true}",
     "disabled"},
    {"elasticity", R, "elastic training changes the batch size", "{\"enabled\": true}", "disabled"},
    {"hybrid_engine", R, "the RLHF generation engine is not implemented", "{\"enabled\": true}",
     "disabled"},
    {"compile", A, "zerort is compiled C++: there is no graph to compile",
     "{\"deepcompile\": true}"},
    {"graph_harvesting", A, "zerort records no CUDA graphs", "true"},
    {"zero_allow_untested_optimizer", A, "zerort's optimizers are all sharded", "true"},
    // Not config keys but DeepSpeed's attribute names, which DeepSpeed ignores in a config; real
    // configs (LLaMA-Factory's) carry them.
    {"monitor_config", A,
     "not a DeepSpeed config key (DeepSpeed ignores it; its monitors are top-level sections)",
     "{\"enabled\": true}"},
    {"comms_config", A, "not a DeepSpeed config key (DeepSpeed ignores it; see comms_logger)",
     "{\"verbose\": false}"},
    {"zero_force_ds_cpu_optimizer", A, "offloaded steps run zerort's own CPU optimizer", "true"},
    // Top-level keys of real configs that DeepSpeed ignores.
    {"cuda_visible_devices", A,
     "not a DeepSpeed config key (DeepSpeed ignores it): zerort uses the devices the launcher "
     "gives each rank (CUDA_VISIBLE_DEVICES and the local rank)",
     "\"0,1\""},
};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsAuto(const nlohmann::json& v) {
  return v.is_string() && Lower(v.get<std::string>()) == "auto";
}

std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.emplace_back(path.substr(start, dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

// The object holding `path`'s last key, or null when a section on the way is missing.
nlohmann::json* Parent(nlohmann::json& root, std::string_view path, std::string* key) {
  const std::vector<std::string> parts = Split(path);
  nlohmann::json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(parts[i]);
    if (it == node->end() || !it->is_object()) return nullptr;
    node = &*it;
  }
  if (!node->is_object()) return nullptr;
  *key = parts.back();
  return node;
}

const nlohmann::json* Find(nlohmann::json& root, std::string_view path) {
  std::string key;
  nlohmann::json* parent = Parent(root, path, &key);
  if (parent == nullptr) return nullptr;
  auto it = parent->find(key);
  return it == parent->end() ? nullptr : &*it;
}

// Erases `path`, and its section when that is left empty (DeepSpeed's "data_types" with only
// accepted keys is nothing zerort's schema should see).
void Erase(nlohmann::json& root, std::string_view path) {
  std::string key;
  nlohmann::json* parent = Parent(root, path, &key);
  if (parent == nullptr) return;
  parent->erase(key);
  const size_t dot = path.rfind('.');
  if (parent->empty() && dot != std::string_view::npos) Erase(root, path.substr(0, dot));
}

// Sets `path`, creating its sections; false when a section on the way is not an object.
bool Set(nlohmann::json& root, std::string_view path, nlohmann::json value) {
  const std::vector<std::string> parts = Split(path);
  nlohmann::json* node = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    nlohmann::json& child = (*node)[parts[i]];
    if (child.is_null()) child = nlohmann::json::object();
    if (!child.is_object()) return false;
    node = &child;
  }
  (*node)[parts.back()] = std::move(value);
  return true;
}

std::string Shown(const nlohmann::json& v) {
  const std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Whether an object asks for anything: an `"enabled": true` anywhere inside it.
bool AnyEnabled(const nlohmann::json& v) {
  if (!v.is_object()) return false;
  for (const auto& [key, value] : v.items()) {
    if (key == "enabled" && value.is_boolean() && value.get<bool>()) return true;
    if (AnyEnabled(value)) return true;
  }
  return false;
}

bool AsksForNothing(const DsKey& k, const nlohmann::json& value) {
  if (k.accept_if.empty()) return false;
  if (k.accept_if == "disabled") return !AnyEnabled(value);
  const nlohmann::json allowed = nlohmann::json::parse(k.accept_if);
  for (const nlohmann::json& a : allowed) {
    if (a == value) return true;
    if (a.is_string() && value.is_string() &&
        Lower(a.get<std::string>()) == Lower(value.get<std::string>())) {
      return true;
    }
  }
  return false;
}

bool IsPath(std::string_view s) { return s.find(' ') == std::string_view::npos; }

// The special mappings: DeepSpeed's legacy boolean forms and its activation checkpointing.
void MapSpecial(nlohmann::json& json, const DsKey& k, const nlohmann::json& value,
                Problems& problems, std::vector<std::string>& notes) {
  const std::string path(k.path);
  auto need_bool = [&]() {
    if (value.is_boolean()) return true;
    problems.Add(
        StrCat(path, " = ", Shown(value), ": expected true or false, got ", value.type_name()));
    return false;
  };
  if (path == "zero_optimization") {  // {"zero_optimization": true}: DeepSpeed's old form
    if (value.is_object() || !need_bool()) return;
    json["zero_optimization"] = {{"stage", value.get<bool>() ? 1 : 0}};
    notes.push_back(StrCat("zero_optimization = ", value.dump(),
                           " (legacy form) read as {\"stage\": ", value.get<bool>() ? 1 : 0, "}"));
  } else if (path == "zero_optimization.cpu_offload" ||
             path == "zero_optimization.cpu_offload_param" ||
             path == "zero_optimization.cpu_offload_params") {
    if (!need_bool()) return;
    const std::string section = path == "zero_optimization.cpu_offload"
                                    ? "zero_optimization.offload_optimizer"
                                    : "zero_optimization.offload_param";
    Erase(json, path);
    if (!value.get<bool>()) return;
    if (Find(json, section + ".device") != nullptr) {
      problems.Add(StrCat(path, " (legacy) and ", section, ".device are both given: keep ", section,
                          " only"));
      return;
    }
    Set(json, section + ".device", "cpu");
    notes.push_back(StrCat(path, " = true (legacy) read as ", section, ".device = \"cpu\""));
  } else if (path == "zero_optimization.cpu_offload_use_pin_memory") {
    if (!need_bool()) return;
    Erase(json, path);
    for (const char* section : {"offload_optimizer", "offload_param"}) {
      const std::string target = StrCat("zero_optimization.", section, ".pin_memory");
      if (Find(json, StrCat("zero_optimization.", section)) != nullptr &&
          Find(json, target) == nullptr) {
        Set(json, target, value);
      }
    }
    notes.push_back(StrCat(path, " (legacy) read as the offload sections' pin_memory"));
  } else if (path == "activation_checkpointing") {
    if (!value.is_object()) {
      problems.Add(StrCat("activation_checkpointing = ", Shown(value),
                          ": expected an object (DeepSpeed's activation checkpointing section)"));
      return;
    }
    Erase(json, path);
    if (const nlohmann::json* own = Find(json, "model.activation_checkpointing")) {
      notes.push_back(StrCat("activation_checkpointing section: model.activation_checkpointing = ",
                             own->dump(), " is given and decides"));
      return;
    }
    Set(json, "model.activation_checkpointing", true);
    notes.push_back(
        "activation_checkpointing section read as model.activation_checkpointing = true: every "
        "block is recomputed in the backward (partition_activations, cpu_checkpointing and the "
        "other keys tune DeepSpeed's own checkpointing function and are accepted)");
  }
}

// Paths whose "auto" has a rule (Hugging Face's integration, README "auto" values).
constexpr std::string_view kAutoPaths[] = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "amp.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
};

void CollectAutos(nlohmann::json& node, const std::string& path, Problems& problems,
                  AutoKeys& autos) {
  if (!node.is_object()) return;
  std::vector<std::string> found;
  for (auto& [key, value] : node.items()) {
    const std::string p = path.empty() ? key : StrCat(path, ".", key);
    if (IsAuto(value) && p != "aio.engine") {  // zerort's aio.engine has a value "auto"
      found.push_back(key);
      if (std::find(std::begin(kAutoPaths), std::end(kAutoPaths), p) != std::end(kAutoPaths)) {
        autos.push_back(p);
      } else {
        problems.Add(StrCat(p,
                            " = \"auto\": no rule resolves \"auto\" for this key (zerort "
                            "resolves it where Hugging Face's DeepSpeed integration does: "
                            "README, \"auto\" values); give a value"));
      }
    } else {
      CollectAutos(value, p, problems, autos);
    }
  }
  for (const std::string& key : found) node.erase(key);
}

}  // namespace

std::span<const DsKey> DeepSpeedKeys() { return kKeys; }

std::string_view DsHandlingName(DsHandling h) {
  switch (h) {
    case DsHandling::kImplemented:
      return "implemented";
    case DsHandling::kMapped:
      return "mapped";
    case DsHandling::kAccepted:
      return "accepted (note)";
    case DsHandling::kRefused:
      return "refused (exit 2)";
  }
  return "?";
}

std::string DeepSpeedKeysMarkdown() {
  std::string out = "| DeepSpeed key | zerort | what zerort does |\n|---|---|---|\n";
  for (const DsKey& k : kKeys) {
    std::string what(k.detail);
    if (k.handling == DsHandling::kMapped && IsPath(k.detail))
      what = StrCat("read as `", k.detail, "`");
    if (k.handling == DsHandling::kRefused && !k.accept_if.empty()) {
      what += k.accept_if == "disabled" ? " (accepted when not enabled)"
                                        : StrCat(" (accepted when ", k.accept_if, ")");
    }
    for (size_t i = 0; (i = what.find('|', i)) != std::string::npos; i += 2)
      what.replace(i, 1, "\\|");
    out += StrCat("| `", k.path, "` | ", DsHandlingName(k.handling), " | ", what, " |\n");
  }
  return out;
}

void NormalizeDeepSpeed(nlohmann::json& json, Problems& problems, std::vector<std::string>& notes,
                        AutoKeys& autos) {
  // An optimizer zerort refuses by type (the schema says why): its parameters say nothing more.
  if (const nlohmann::json* type = Find(json, "optimizer.type"); type && type->is_string()) {
    const std::string t = Lower(type->get<std::string>());
    if (t == "onebitadam" || t == "onebitlamb" || t == "zerooneadam") {
      Erase(json, "optimizer.params");
    }
  }
  // Top-level keys beginning with "_" are comments ("_comment", "_description"): DeepSpeed reads
  // the keys it knows and never looks at them.
  std::vector<std::string> comments;
  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') comments.push_back(key);
  }
  for (const std::string& key : comments) {
    notes.push_back(StrCat(key, ": a comment (a top-level key beginning with _), ignored"));
    json.erase(key);
  }
  // Mapped names first, so "auto" and the other rows see the current paths.
  for (const DsKey& k : kKeys) {
    if (k.handling != DsHandling::kMapped) continue;
    const nlohmann::json* found = Find(json, k.path);
    if (found == nullptr) continue;
    const nlohmann::json value = *found;
    if (!IsPath(k.detail)) {
      MapSpecial(json, k, value, problems, notes);
      continue;
    }
    if (Find(json, k.detail) != nullptr) {
      problems.Add(StrCat(k.path, " and ", k.detail, " are both given (", k.path,
                          " is DeepSpeed's other name for it): keep one"));
      continue;
    }
    Erase(json, k.path);
    if (!Set(json, k.detail, value)) {
      problems.Add(StrCat(k.path, ": cannot be read as ", k.detail,
                          " (a section on the way is not "
                          "an object)"));
      continue;
    }
    notes.push_back(StrCat(k.path, " read as ", k.detail, " (DeepSpeed's other name)"));
  }
  CollectAutos(json, "", problems, autos);
  // Accepted and refused keys. A key the schema reads too (fp16.enabled) stays for it.
  for (const DsKey& k : kKeys) {
    if (k.handling != DsHandling::kAccepted && k.handling != DsHandling::kRefused) continue;
    const nlohmann::json* found = Find(json, k.path);
    if (found == nullptr || found->is_null()) continue;
    const nlohmann::json value = *found;
    if (k.handling == DsHandling::kRefused && !AsksForNothing(k, value)) {
      problems.Add(StrCat(k.path, " = ", Shown(value),
                          ": a DeepSpeed key zerort does not support: ", k.detail));
      Erase(json, k.path);  // not "unknown" as well
      continue;
    }
    Erase(json, k.path);
    if (k.handling == DsHandling::kAccepted) {
      notes.push_back(StrCat(k.path, " = ", Shown(value), ": accepted; ", k.detail));
    }
  }
  // DeepSpeed's sections that zerort's schema does not have: what is left in them is unknown.
  for (const char* section : {"data_types", "tensor_parallel"}) {
    const nlohmann::json* left = Find(json, section);
    if (left == nullptr) continue;
    if (left->is_object()) {
      for (const auto& [key, value] : left->items()) {
        problems.Add(StrCat("unknown key '", section, ".", key, "' (DeepSpeed's ", section,
                            " section has no such key)"));
      }
    } else {
      problems.Add(StrCat(section, " = ", Shown(*left), ": expected an object"));
    }
    json.erase(section);
  }
}

void ResolveAutoValues(const AutoKeys& autos, const RunConfig& first, nlohmann::json& json,
                       std::vector<std::string>& notes) {
  const int64_t d = first.model.shape.d_model;
  const OptimizerConfig& o = first.optimizer;
  auto set = [&](std::string_view path, const nlohmann::json& value, std::string_view from) {
    Set(json, path, value);
    notes.push_back(StrCat(path, " = \"auto\" -> ", value.dump(), " (", from, ")"));
  };
  auto given = [&](std::string_view p) { return Find(json, p) != nullptr; };
  for (const std::string& p : autos) {
    if (p == "train_batch_size" || p == "train_micro_batch_size_per_gpu" ||
        p == "gradient_accumulation_steps") {
      continue;  // below, once for the triple
    } else if (p == "gradient_clipping") {
      set(p, 1.0, "Hugging Face's max_grad_norm default");
    } else if (p == "optimizer.params.lr") {
      set(p, o.lr, "zerort's default learning rate");
    } else if (p == "optimizer.params.betas") {
      set(p, {o.betas[0], o.betas[1]}, "zerort's default, as Hugging Face's");
    } else if (p == "optimizer.params.eps") {
      set(p, o.eps, "zerort's default, as Hugging Face's");
    } else if (p == "optimizer.params.weight_decay") {
      set(p, o.weight_decay, "zerort's default, as Hugging Face's");
    } else if (p == "scheduler.params.warmup_min_lr") {
      set(p, 0, "Hugging Face's rule");
    } else if (p == "scheduler.params.warmup_max_lr") {
      set(p, o.lr, "optimizer.params.lr");
    } else if (p == "scheduler.params.warmup_num_steps") {
      set(p, 0, "Hugging Face's warmup_steps default");
    } else if (p == "scheduler.params.total_num_steps") {
      set(p, first.train.steps, "train.steps");
    } else if (p == "fp16.enabled" || p == "bf16.enabled" || p == "amp.enabled") {
      set(p, false, "Hugging Face's default: no mixed precision unless asked");
    } else if (p == "zero_optimization.reduce_bucket_size") {
      set(p, d * d, "model.d_model^2");
    } else if (p == "zero_optimization.stage3_prefetch_bucket_size") {
      set(p, static_cast<int64_t>(0.9 * static_cast<double>(d * d)), "0.9 x model.d_model^2");
    } else if (p == "zero_optimization.stage3_param_persistence_threshold") {
      set(p, 10 * d, "10 x model.d_model");
    } else if (p == "zero_optimization.stage3_gather_16bit_weights_on_model_save") {
      set(p, false, "Accelerate's zero3_save_16bit_model default");
    }
  }
  const bool batch_auto = std::any_of(autos.begin(), autos.end(), [](const std::string& p) {
    return p == "train_batch_size" || p == "train_micro_batch_size_per_gpu" ||
           p == "gradient_accumulation_steps";
  });
  if (!batch_auto) return;
  if (!given("train_batch_size") && !given("train_micro_batch_size_per_gpu")) {
    set("train_micro_batch_size_per_gpu", 8,
        "Hugging Face's per_device_train_batch_size default; the rest of the triple follows");
  } else {
    notes.push_back(
        "batch keys given as \"auto\" follow from the others and the data-parallel size");
  }
}

}  // namespace zerort
