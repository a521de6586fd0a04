// The field table's rows (config_rows.h), every section but the optimizer's
// (config_schema_optimizer.cc): one declaration per key, in the order the keys are read,
// printed and documented.
#include <string_view>
#include <vector>

#include "zerort/config/config_readers.h"
#include "zerort/config/config_rows.h"

namespace zerort::config_rows {
namespace {

using namespace config_readers;  // the rows' own readers

// The offload sections share their keys; each has its own defaults (config.h) and a few of its own.
void AddOffload(std::vector<ConfigField>& t, std::string_view s, bool param) {
  // A FieldRef is captureless: each section names its members.
  if (param) {
#define ZR_OFF(m) ZR_MEMBER(zero.offload_param.m)
    t.push_back(Str(s, "device", ZR_OFF(device), {"none", "cpu", "nvme"},
                    "where the stage-3 compute shards live: none keeps them on the device"));
    t.push_back(Str(s, "nvme_path", ZR_OFF(nvme_path), {},
                    "directory of the NVMe store (device nvme; the optimizer's must be the same)"));
    t.push_back(Bool(s, "pin_memory", ZR_OFF(pin_memory),
                     "page-locked host buffers (faster copies), DeepSpeed's default"));
    t.push_back(Num<int>(s, "buffer_count", ZR_OFF(buffer_count), 1, 1024,
                         "parameter fetches in flight, DeepSpeed's 5"));
    t.push_back(Num<int64_t>(s, "buffer_size", ZR_OFF(buffer_size), 1, kMaxConfigIntAsDouble,
                             "elements per parameter fetch buffer at most (each is the largest "
                             "offloaded shard), DeepSpeed's 1e8"));
    t.push_back(Num<int64_t>(s, "max_in_cpu", ZR_OFF(max_in_cpu), 0, kMaxConfigIntAsDouble,
                             "accepted for DeepSpeed compatibility; zerort keeps no host cache"));
#undef ZR_OFF
  } else {
#define ZR_OFF(m) ZR_MEMBER(zero.offload_optimizer.m)
    t.push_back(Str(s, "device", ZR_OFF(device), {"none", "cpu", "nvme"},
                    "where the fp32 masters, moments and gradient shards live (stages 1-3); the "
                    "step runs on the CPU when not on the device"));
    t.push_back(Str(s, "nvme_path", ZR_OFF(nvme_path), {},
                    "directory of the NVMe store (device nvme): one file per rank"));
    t.push_back(Bool(s, "pin_memory", ZR_OFF(pin_memory),
                     "page-locked host buffers (faster copies), DeepSpeed's default"));
    t.push_back(Num<int>(s, "buffer_count", ZR_OFF(buffer_count), 2, 1024,
                         "optimizer chunks in flight through the NVMe pipeline, DeepSpeed's 4"));
    t.push_back(Num<double>(s, "ratio", ZR_OFF(ratio), 0, 1,
                            "device cpu: the share of the units whose optimizer state goes to "
                            "the host, the last ones; the first stay on the device (DeepSpeed's "
                            "Twin-Flow, docs/offload.md; stages 1-3, DeepSpeed reads it at 3; "
                            "not with nvme or the 1-bit optimizers)"));
#undef ZR_OFF
  }
}

}  // namespace

std::vector<ConfigField> BuildTable() {
  std::vector<ConfigField> t;
  const std::string_view top = "";
  t.push_back(With(
      Num<int64_t>(top, "train_batch_size", ZR_MEMBER(train_batch_size), 1, kMaxConfigIntAsDouble,
                   "global batch = micro x accumulation x data-parallel size; any "
                   "two of the three determine the third"),
      kOmitUnset));
  t.push_back(With(
      Num<int64_t>(top, "train_micro_batch_size_per_gpu", ZR_MEMBER(train_micro_batch_size_per_gpu),
                   1, kMaxConfigIntAsDouble, "sequences per rank per micro-batch"),
      kOmitUnset));
  t.push_back(With(
      Num<int64_t>(top, "gradient_accumulation_steps", ZR_MEMBER(gradient_accumulation_steps), 1,
                   kMaxConfigIntAsDouble, "micro-batches per step (a pipeline's micro-batches)"),
      kOmitUnset));
  t.push_back(Num<float>(top, "gradient_clipping", ZR_MEMBER(manager.gradient_clipping), 0, 1e30,
                         "max global gradient norm; 0: off (DeepSpeed's default)"));
  t.push_back(Num<int64_t>(top, "steps_per_print", ZR_MEMBER(steps_per_print), 1,
                           kMaxConfigIntAsDouble, "steps between metrics lines, DeepSpeed's 10"));
  t.push_back(Bool(top, "prescale_gradients", ZR_MEMBER(prescale_gradients),
                   "divide gradients by the data-parallel size before the reduction, not after"));
  t.push_back(Num<double>(top, "gradient_predivide_factor", ZR_MEMBER(gradient_predivide_factor),
                          1e-6, 1e6,
                          "divide by f before the reduction and by (size / f) after (ignored "
                          "with prescale_gradients, as DeepSpeed ignores it)"));
  t.push_back(Bool(top, "wall_clock_breakdown", ZR_MEMBER(wall_clock_breakdown),
                   "seconds per phase (forward, backward, reduce, optimizer, gather) in the "
                   "metrics"));
  t.push_back(Num<uint64_t>(top, "seed", ZR_MEMBER(seed), 0, kMaxConfigIntAsDouble,
                            "initialisation and data order"));

  const std::string_view z = "zero_optimization";
  t.push_back(Num<int>(z, "stage", ZR_MEMBER(zero.stage), 0, 3,
                       "ZeRO stage: 0 data parallelism, 1 optimizer state, 2 + gradients, 3 + "
                       "parameters sharded"));
  t.push_back(Bool(z, "overlap_comm", ZR_MEMBER(manager.overlap_comm),
                   "reduce gradients on the communication stream during the backward"));
  t.push_back(Num<int64_t>(z, "reduce_bucket_size", ZR_MEMBER(manager.reduce_bucket_size), 0,
                           kMaxConfigIntAsDouble,
                           "elements per gradient reduction bucket; 0: each unit alone"));
  t.push_back(
      Num<int64_t>(z, "stage3_prefetch_bucket_size", ZR_MEMBER(manager.stage3_prefetch_bucket_size),
                   0, kMaxConfigIntAsDouble,
                   "stage 3: elements of parameters gathered ahead of use; 0: no prefetch"));
  t.push_back(Num<int64_t>(z, "stage3_param_persistence_threshold",
                           ZR_MEMBER(manager.stage3_param_persistence_threshold), 0,
                           kMaxConfigIntAsDouble,
                           "stage 3: units smaller than this stay gathered, DeepSpeed's 1e5"));
  t.push_back(Num<int64_t>(z, "stage3_max_live_parameters",
                           ZR_MEMBER(manager.stage3_max_live_parameters), 0, kMaxConfigIntAsDouble,
                           "stage 3: elements gathered at once; 0: only the unit in use"));
  t.push_back(
      Num<int64_t>(z, "stage3_max_reuse_distance", ZR_MEMBER(manager.stage3_max_reuse_distance), 0,
                   kMaxConfigIntAsDouble,
                   "stage 3: a unit used again within this many elements of other units "
                   "stays gathered; zerort's 0 releases after every use (DeepSpeed's 1e9)"));
  t.push_back(
      Num<int64_t>(z, "allgather_bucket_size", ZR_MEMBER(manager.allgather_bucket_size), 1,
                   kMaxConfigIntAsDouble,
                   "stages 1-2: elements per all-gather of the updated parameters; a larger unit "
                   "goes in pieces through a staging buffer of that size"));
  t.push_back(Bool(z, "contiguous_gradients", ZR_MEMBER(zero.contiguous_gradients),
                   "accepted for DeepSpeed compatibility: zerort's gradients are always "
                   "contiguous"));
  t.push_back(Bool(z, "allgather_partitions", ZR_MEMBER(manager.allgather_partitions),
                   "false: a broadcast per rank instead of one all-gather (the same weights)"));
  t.push_back(Bool(z, "reduce_scatter", ZR_MEMBER(manager.reduce_scatter),
                   "false: stages 2-3 all-reduce and each rank keeps its shard (the same "
                   "numbers); stages 0-1 always all-reduce"));
  t.push_back(Num<int>(z, "mics_shard_size", ZR_MEMBER(zero.mics_shard_size), -1, 1 << 16,
                       "DeepSpeed's MiCS (stage 3): the state sharded over groups of this many "
                       "data ranks, replicated across them, as parallel.data_shard_size; <= 0: "
                       "off"));
  t.push_back(
      Num<int>(z, "zero_hpz_partition_size", ZR_MEMBER(manager.hpz_partition_size), 1, 1 << 16,
               "ZeRO++ hpZ (stage 3): a secondary copy of each unit's weights sharded over "
               "groups of this many ranks (a node) serves the step's later gathers; 1: off"));
  t.push_back(
      Bool(z, "zero_quantized_weights", ZR_MEMBER(manager.quantized_weights),
           "ZeRO++ qwZ (stage 3): weights all-gathered as int8 in groups of 4k-8k with "
           "fp32 scales (about half of bf16's bytes); changes the weights the model reads"));
  t.push_back(Bool(z, "zero_quantized_gradients", ZR_MEMBER(manager.quantized_gradients),
                   "ZeRO++ qgZ (stage 3): the gradient reduce-scatter as int8 all-to-alls, inside "
                   "the node then across (about a quarter of fp32's bytes on each link)"));
  t.push_back(Bool(z, "stage3_gather_16bit_weights_on_model_save",
                   ZR_MEMBER(zero.stage3_gather_16bit_weights_on_model_save),
                   "each checkpoint also writes the consolidated weights in the compute dtype as "
                   "a Hugging Face model in step_<N>/hf/"));
  t.push_back(Num<int64_t>(z, "sub_group_size", ZR_MEMBER(manager.offload.sub_group_size), 0,
                           kMaxConfigIntAsDouble,
                           "elements per NVMe optimizer chunk; 0: one chunk per unit's shard"));
  AddOffload(t, "zero_optimization.offload_optimizer", false);
  AddOffload(t, "zero_optimization.offload_param", true);

  const std::string_view aio = "aio";
  t.push_back(Num<int64_t>(aio, "block_size", ZR_MEMBER(manager.offload.aio_block_size), 4096,
                           1 << 30, "bytes per NVMe request, a multiple of 4096"));
  t.push_back(Num<int>(aio, "queue_depth", ZR_MEMBER(manager.offload.aio_queue_depth), 1, 4096,
                       "NVMe requests in flight"));
  t.push_back(Num<int>(aio, "thread_count", ZR_MEMBER(manager.offload.aio_thread_count), 1, 256,
                       "pread/pwrite threads when io_uring is refused"));
  t.push_back(Bool(aio, "single_submit", ZR_MEMBER(manager.offload.aio_single_submit),
                   "submit NVMe requests one at a time"));
  t.push_back(Bool(aio, "overlap_events", ZR_MEMBER(manager.offload.aio_overlap_events),
                   "refill the queue as requests complete"));
  t.push_back(Str(aio, "engine", ZR_MEMBER(manager.offload.aio_engine),
                  {"auto", "io_uring", "threads"},
                  "zerort's: the NVMe I/O engine; threads forces the fallback"));

  const std::string_view f16 = "fp16";
  t.push_back(Bool(f16, "enabled", ZR_MEMBER(fp16.enabled),
                   "fp16 weights and activations, fp32 masters and reduction, dynamic loss "
                   "scaling (the scale and skipped steps in the metrics)"));
  t.push_back(Num<float>(f16, "loss_scale", ZR_MEMBER(fp16.loss_scale), 0, 1e30,
                         "a static loss scale; 0: dynamic (DeepSpeed's convention)"));
  t.push_back(Num<int>(f16, "initial_scale_power",
                       ZR_MEMBER(manager.loss_scale.initial_scale_power), 0, 64,
                       "the dynamic scale starts at 2^this"));
  t.push_back(Num<int>(f16, "loss_scale_window", ZR_MEMBER(manager.loss_scale.loss_scale_window), 1,
                       1 << 30, "overflow-free steps before the scale doubles"));
  t.push_back(Num<int>(f16, "hysteresis", ZR_MEMBER(manager.loss_scale.hysteresis), 1, 1 << 30,
                       "overflows tolerated before the scale halves"));
  t.push_back(Num<float>(
      f16, "min_loss_scale", ZR_MEMBER(manager.loss_scale.min_loss_scale), 0, 1e30,
      "the dynamic scale's floor (below 1: a warning; newer DeepSpeed takes an integer)"));
  t.push_back(Num<int>(f16, "max_consecutive_skips",
                       ZR_MEMBER(manager.loss_scale.max_consecutive_skips), 1, 1 << 30,
                       "zerort's: stop the run (exit 1) after this many steps in a row skipped "
                       "for non-finite gradients, in any precision"));
  t.push_back(Bool("bf16", "enabled", ZR_MEMBER(bf16), "bf16 compute, fp32 masters and reduction"));

  AddOptimizerRows(t);

  t.push_back(With(Custom("scheduler", "type", ZR_MEMBER(scheduler.type), ReadSchedulerType,
                          {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
                          "the learning-rate schedule; absent: a constant optimizer.params.lr; "
                          "OneCycle and LRRangeTest are refused by name"),
                   kOmitUnset));
  const std::string_view sp = "scheduler.params";
  const std::vector<std::string_view> warmup = {"WarmupLR", "WarmupDecayLR"};
  const std::vector<std::string_view> all = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  const std::vector<std::string_view> total = {"WarmupDecayLR", "WarmupCosineLR"};
  t.push_back(Owned(Num<float>(sp, "warmup_min_lr", ZR_MEMBER(scheduler.warmup_min_lr), 0, 1e3,
                               "the learning rate at step 0"),
                    warmup));
  t.push_back(Owned(Num<float>(sp, "warmup_max_lr", ZR_MEMBER(scheduler.warmup_max_lr), 0, 1e3,
                               "the learning rate after the warm-up, DeepSpeed's 0.001"),
                    warmup));
  t.push_back(Owned(Num<int64_t>(sp, "warmup_num_steps", ZR_MEMBER(scheduler.warmup_num_steps), 0,
                                 kMaxConfigIntAsDouble, "steps of the warm-up, DeepSpeed's 1000"),
                    all));
  t.push_back(Owned(Str(sp, "warmup_type", ZR_MEMBER(scheduler.warmup_type), {"log", "linear"},
                        "the warm-up's curve, DeepSpeed's log"),
                    all));
  t.push_back(
      Owned(With(Num<int64_t>(sp, "total_num_steps", ZR_MEMBER(scheduler.total_num_steps), 1,
                              kMaxConfigIntAsDouble, "steps of the whole schedule (required)"),
                 kOmitUnset),
            total));
  t.push_back(Owned(Num<float>(sp, "warmup_min_ratio", ZR_MEMBER(scheduler.warmup_min_ratio), 0, 1,
                               "the learning rate's ratio at step 0"),
                    {"WarmupCosineLR"}));
  t.push_back(Owned(Num<float>(sp, "cos_min_ratio", ZR_MEMBER(scheduler.cos_min_ratio), 0, 1,
                               "the final ratio, DeepSpeed's 0.0001"),
                    {"WarmupCosineLR"}));

  const std::string_view m = "model";
  t.push_back(With(Custom(m, "preset", std::monostate{}, ReadPreset, {},
                          "a named shape (tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
                          "llama-tiny); the shape keys override its values"),
                   kNotPrinted));
  t.push_back(Enum(m, "arch", ZR_ENUM(model.shape.arch),
                   {ModelArchName(ModelArch::kGpt2), ModelArchName(ModelArch::kLlama)},
                   "gpt2: learned positions, LayerNorm, GELU, tied head; llama: rotary "
                   "positions, RMSNorm, SwiGLU, grouped-query attention (the keys below)"));
  t.push_back(
      Num<int>(m, "n_layer", ZR_MEMBER(model.shape.n_layer), 1, 1 << 16, "transformer blocks"));
  t.push_back(Num<int>(m, "n_head", ZR_MEMBER(model.shape.n_head), 1, 1 << 16,
                       "attention heads (divides d_model)"));
  t.push_back(Num<int>(m, "d_model", ZR_MEMBER(model.shape.d_model), 1, 1 << 20, "hidden size"));
  t.push_back(Num<int>(m, "seq_len", ZR_MEMBER(model.shape.seq_len), 1, 1 << 20,
                       "tokens per sequence (the context)"));
  t.push_back(Num<int>(m, "vocab_size", ZR_MEMBER(model.shape.vocab_size), 1, 1 << 24,
                       "vocabulary (256: zerort's byte tokens)"));
  t.push_back(Num<int>(m, "n_kv_head", ZR_MEMBER(model.shape.n_kv_head), 0, 1 << 16,
                       "llama: key/value heads (divides n_head; 1: multi-query); 0: n_head"));
  t.push_back(With(Num<int>(m, "head_dim", ZR_MEMBER(model.shape.head_dim), 0, 1 << 16,
                            "llama: a head's channels (Hugging Face's head_dim; Mistral-Nemo's 128 "
                            "over d 5120 and 32 heads); 0 or unset: d_model / n_head"),
                   kOmitUnset));
  t.push_back(Num<int>(m, "intermediate_size", ZR_MEMBER(model.shape.intermediate_size), 0, 1 << 24,
                       "llama: the SwiGLU MLP's channels (required)"));
  t.push_back(Num<double>(m, "rope_theta", ZR_MEMBER(model.shape.rope_theta), 1, 1e12,
                          "llama: the rotary embeddings' base"));
  t.push_back(Num<double>(m, "rms_norm_eps", ZR_MEMBER(model.shape.norm_eps), 0, 1,
                          "llama: RMSNorm's epsilon"));
  t.push_back(Bool(m, "tie_word_embeddings", ZR_MEMBER(model.shape.tie_word_embeddings),
                   "llama: the output projection is the token embedding"));
  t.push_back(Bool(m, "qkv_bias", ZR_MEMBER(model.shape.qkv_bias),
                   "llama: Q, K and V projections with biases (Qwen2; with o_proj_bias, LLaMA's "
                   "attention_bias)"));
  t.push_back(Bool(m, "o_proj_bias", ZR_MEMBER(model.shape.o_proj_bias),
                   "llama: the attention's output projection with a bias"));
  t.push_back(Bool(m, "mlp_bias", ZR_MEMBER(model.shape.mlp_bias),
                   "llama: gate, up and down projections with biases (LLaMA's mlp_bias)"));
  t.push_back(Bool(m, "qk_norm", ZR_MEMBER(model.shape.qk_norm),
                   "llama: each query and key head RMSNorm-ed before the rotation, one gain of "
                   "head size for the query heads and one for the key heads (Qwen3's q_norm and "
                   "k_norm)"));
  t.push_back(Num<int>(m, "sliding_window", ZR_MEMBER(model.shape.sliding_window), 0, 1 << 24,
                       "llama: Mistral's attention window; 0: none (seq_len may not exceed it: "
                       "full causal attention is exact up to the window)"));
  t.push_back(Str(m, "init_from", ZR_MEMBER(model.init_from), {},
                  "a Hugging Face model directory (config.json, safetensors): the initial "
                  "weights, streamed per unit; its config.json must be this model's"));
  t.push_back(Bool(m, "activation_checkpointing", ZR_MEMBER(model.activation_checkpointing),
                   "recompute each block's activations in the backward (less memory, more time)"));
  t.push_back(Num<int64_t>(m, "head_chunk_rows", ZR_MEMBER(model.head_chunk_rows), 0,
                           double{int64_t{1} << 40},
                           "rows of the head's logits at a time; 0: automatic (2 d_model)"));
  t.push_back(With(Str(m, "attention_backend", ZR_MEMBER(model.attention_backend),
                       {"flash", "materialised", "cudnn"},
                       "the attention program on CUDA (Megatron's attention_backend): absent: "
                       "zerort's flash kernels for bf16/fp16 at head sizes 64 and 128, else "
                       "materialised; flash: refused where those kernels do not apply; "
                       "materialised: the B x H x T x T probabilities saved (Megatron's "
                       "unfused); cudnn: cuDNN's fused flash attention (bf16/fp16, head sizes "
                       "multiples of 8 up to 128, sequences longer than one token; builds "
                       "configured with ZR_CUDNN_FRONTEND, "
                       "libcudnn 9 at run time). The CPU runs flash always"),
                   kOmitUnset));
  const std::string_view fa = "model.flash_attention";
  t.push_back(With(Num<int>(fa, "forward_block_queries",
                            ZR_MEMBER(model.flash_attention.forward_block_queries), 0, 128,
                            "CUDA flash forward: queries a thread block owns, 64 or 128; 0: the "
                            "default (64, or 128 with forward_warps 8)"),
                   kOmitUnset));
  t.push_back(
      With(Num<int>(fa, "forward_warps", ZR_MEMBER(model.flash_attention.forward_warps), 0, 8,
                    "CUDA flash forward: warps a thread block has, 4 or 8 (128 queries on "
                    "4 warps: two row groups a warp, head size 64 only); 0: the default "
                    "(4, or 8 for 128 queries at head size 128)"),
           kOmitUnset));
  t.push_back(With(Num<int>(fa, "backward_block_keys",
                            ZR_MEMBER(model.flash_attention.backward_block_keys), 0, 128,
                            "CUDA flash backward: keys a thread block owns, 64 or 128 (head size "
                            "64 only); 0: the default (64)"),
                   kOmitUnset));
  t.push_back(With(Num<int>(fa, "backward_query_chunk",
                            ZR_MEMBER(model.flash_attention.backward_query_chunk), 0, 64,
                            "CUDA flash backward: queries a warp takes at a time, 64 (head size "
                            "64 only) or 32; 0: the default (64 at head size 64, 32 at 128)"),
                   kOmitUnset));
  const std::string_view rs = "model.rope_scaling";
  t.push_back(Custom(rs, "rope_type", ZR_ENUM(model.shape.rope_scaling.type), ReadRopeType,
                     {RopeTypeName(RopeType::kDefault), RopeTypeName(RopeType::kLinear),
                      RopeTypeName(RopeType::kLlama3), RopeTypeName(RopeType::kYarn),
                      RopeTypeName(RopeType::kDynamic)},
                     "llama: the rotary frequencies' remap, Hugging Face's rope_scaling: default "
                     "(none), linear (divided by factor), llama3 (LLaMA 3.1's bands), yarn "
                     "(YaRN's ramp and attention factor), dynamic (NTK: the base raised for a "
                     "seq_len above original_max_position_embeddings)"));
  t.push_back(With(Num<double>(rs, "factor", ZR_MEMBER(model.shape.rope_scaling.factor), 0, 1e6,
                               "linear, llama3, yarn, dynamic: the context's extension (>= 1)"),
                   kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "low_freq_factor", ZR_MEMBER(model.shape.rope_scaling.low_freq_factor),
                       0, 1e6, "llama3: wavelengths above original / this are divided by factor"),
           kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "high_freq_factor", ZR_MEMBER(model.shape.rope_scaling.high_freq_factor),
                       0, 1e6, "llama3: wavelengths below original / this are kept"),
           kOmitUnset));
  t.push_back(With(
      Num<int>(rs, "original_max_position_embeddings",
               ZR_MEMBER(model.shape.rope_scaling.original_max_position_embeddings), 0, 1 << 24,
               "llama3, yarn, dynamic: the context the model was first trained on "
               "(dynamic: Hugging Face's max_position_embeddings)"),
      kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "attention_factor", ZR_MEMBER(model.shape.rope_scaling.attention_factor),
                       0, 1e6, "yarn: the cosines' and sines' scale; unset: 0.1 ln(factor) + 1"),
           kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "beta_fast", ZR_MEMBER(model.shape.rope_scaling.beta_fast), 0, 1e6,
                       "yarn: pairs turning more often over the original context "
                       "are kept; unset: 32"),
           kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "beta_slow", ZR_MEMBER(model.shape.rope_scaling.beta_slow), 0, 1e6,
                       "yarn: pairs turning less often are divided by factor; "
                       "unset: 1"),
           kOmitUnset));
  t.push_back(With(Num<double>(rs, "mscale", ZR_MEMBER(model.shape.rope_scaling.mscale), 0, 1e6,
                               "yarn (DeepSeek's): with mscale_all_dim, the attention factor "
                               "mscale(factor, mscale) / mscale(factor, mscale_all_dim)"),
                   kOmitUnset));
  t.push_back(
      With(Num<double>(rs, "mscale_all_dim", ZR_MEMBER(model.shape.rope_scaling.mscale_all_dim), 0,
                       1e6, "yarn: see mscale"),
           kOmitUnset));

  t.push_back(Str("data", "path", ZR_MEMBER(data.path), {},
                  "token file: zerort's (zerort data prepare), an llm.c shard, a Megatron indexed "
                  "dataset (PREFIX, .idx or .bin) or a raw array (data.format); memory-mapped, "
                  "never read whole; empty: the built-in corpus"));
  t.push_back(Custom("data", "blend", ZR_MEMBER(data.blend), ReadBlend, {},
                     "several token files blended by weight, Megatron's data_path: [0.3, "
                     "\"a.bin\", 0.7, \"b\"] (each read as data.path is); instead of data.path"));
  t.push_back(Str("data", "tokenizer", ZR_MEMBER(data.tokenizer), {},
                  "the tokenizer the data was prepared with (a tokenizer.json or a "
                  "SentencePiece .model; zerort data prepare --tokenizer): the sample's prompt "
                  "and text, and eod_mask_loss's end-of-text token; empty: byte tokens"));
  t.push_back(Bool("data", "eod_mask_loss", ZR_MEMBER(data.eod_mask_loss),
                   "Megatron's document-boundary loss mask: a position whose input is the "
                   "end-of-text token adds no loss (the next document's first token is not "
                   "predicted from the last one's)"));
  t.push_back(Num<int>("data", "eos_token_id", ZR_MEMBER(data.eos_token_id), -1, 1 << 24,
                       "the end-of-text token of eod_mask_loss; -1: data.tokenizer's"));
  t.push_back(Str("data", "format", ZR_MEMBER(data.format), {"detect", "uint16", "uint32"},
                  "detect: by the file's header; uint16/uint32: a raw little-endian token array "
                  "without one (nanoGPT's train.bin)"));
  t.push_back(Num<double>("data", "validation_fraction", ZR_MEMBER(data.validation_fraction), 0,
                          0.5, "the file's tail held out for evaluation"));

  const std::string_view tr = "train";
  t.push_back(Num<int64_t>(tr, "steps", ZR_MEMBER(train.steps), 1, kMaxConfigIntAsDouble,
                           "optimizer steps of the run"));
  t.push_back(Num<int64_t>(tr, "eval_interval", ZR_MEMBER(train.eval_interval), 0,
                           kMaxConfigIntAsDouble, "evaluate every N steps; 0: only at the end"));
  t.push_back(Num<int>(tr, "eval_windows", ZR_MEMBER(train.eval_windows), 1, 1 << 20,
                       "validation windows per evaluation (per run, not per rank)"));
  t.push_back(Num<int>(tr, "sample_tokens", ZR_MEMBER(train.sample_tokens), 0, 1 << 20,
                       "text sampled at the end; 0: none"));
  t.push_back(
      Str(tr, "sample_prompt", ZR_MEMBER(train.sample_prompt), {}, "the sample's prompt (bytes)"));
  t.push_back(Num<float>(tr, "sample_temperature", ZR_MEMBER(train.sample_temperature), 0, 100,
                         "0: greedy; below 1 sharpens a small model's text"));
  t.push_back(Num<int>(tr, "sample_top_k", ZR_MEMBER(train.sample_top_k), 0, 1 << 24,
                       "0: the whole vocabulary"));
  t.push_back(With(Str(tr, "device", ZR_MEMBER(train.device), {"cpu", "cpu-async", "cuda"},
                       "absent: cuda when a GPU is present, else cpu; cpu-async: every stream a "
                       "queue with a thread of its own, as on a GPU (docs/async-device.md)"),
                   kOmitUnset));
  t.push_back(With(Num<int64_t>(tr, "async_jitter_seed", ZR_MEMBER(train.async_jitter_seed), 0,
                                kMaxConfigIntAsDouble,
                                "cpu-async: delay each queued item by a random time drawn from "
                                "this seed, so that ordering bugs show; 0: no delay"),
                   kOmitUnset));
  t.push_back(With(Num<int>(tr, "async_jitter_max_us", ZR_MEMBER(train.async_jitter_max_us), 1,
                            1'000'000, "cpu-async with a jitter seed: the longest delay (us)"),
                   kOmitUnset));
  t.push_back(Bool(tr, "overlap_host_step", ZR_MEMBER(train.overlap_host_step),
                   "offload_optimizer cpu on a GPU (and cpu-async): the CPU step of AdamW, Adam "
                   "and SGD overlaps the next forward (the same numbers; docs/offload.md)"));
  t.push_back(Bool(tr, "device_grad_sums", ZR_MEMBER(train.device_grad_sums),
                   "offload_optimizer cpu: sum each step's micro-batch gradients on the device "
                   "(fp32, 4 bytes a parameter of the rank's shard) and copy the sum to the host "
                   "once a step, instead of every micro-batch's to the host to be summed there "
                   "(the same numbers; docs/offload.md)"));
  t.push_back(With(Num<double>(tr, "peak_tflops", ZR_MEMBER(train.peak_tflops), 0, 1e5,
                               "a device's peak TFLOP/s, MFU's denominator (step lines, "
                               "metrics.jsonl, bench model); 0: the GPU's dense bf16 peak by its "
                               "name where zerort knows it (H100, H200, A100, L40S, ...), else no "
                               "MFU"),
                   kOmitUnset));
  t.push_back(Bool(tr, "check_memory", ZR_MEMBER(train.check_memory),
                   "refuse (exit 2) a run whose estimated peak does not fit this rank's memory"));

  const std::string_view ck = "checkpoint";
  t.push_back(Str(ck, "dir", ZR_MEMBER(checkpoint.dir), {}, "empty: no checkpoints"));
  t.push_back(Num<int64_t>(ck, "interval", ZR_MEMBER(checkpoint.interval), 0, kMaxConfigIntAsDouble,
                           "save every N steps; 0: only at the end and on signals"));
  t.push_back(Num<int>(ck, "keep_last_n", ZR_MEMBER(checkpoint.keep_last_n), 0, 1 << 20,
                       "older step directories are removed; 0 keeps all"));

  const std::string_view lg = "logging";
  t.push_back(Str(lg, "metrics_file", ZR_MEMBER(logging.metrics_file), {},
                  "empty: <checkpoint.dir>/metrics.jsonl, or none without a dir"));
  t.push_back(Str(lg, "level", ZR_MEMBER(logging.level),
                  {"trace", "debug", "info", "warn", "error", "off"}, "the log's level"));
  t.push_back(Str(lg, "trace_file", ZR_MEMBER(logging.trace_file), {},
                  "Chrome trace-event JSON of every rank's work; empty: none. A new run "
                  "refuses a non-empty one unless --overwrite (a resumed run replaces it)"));

  const std::string_view cm = "csv_monitor";
  t.push_back(Bool(cm, "enabled", ZR_MEMBER(csv_monitor.enabled),
                   "rank 0 writes loss, learning rate, loss scale, validation loss and tokens/s "
                   "as CSV files"));
  t.push_back(Str(cm, "output_path", ZR_MEMBER(csv_monitor.output_path), {},
                  "their directory's parent; empty: the working directory"));
  t.push_back(Str(cm, "job_name", ZR_MEMBER(csv_monitor.job_name), {},
                  "their directory's name (a plain name)"));

  const std::string_view pa = "parallel";
  t.push_back(Num<int>(pa, "tensor_parallel_size", ZR_MEMBER(parallel.tensor_parallel_size), 1,
                       1 << 16,
                       "Megatron tensor parallelism; the world is data x tensor x pipeline"));
  t.push_back(Bool(pa, "sequence_parallel", ZR_MEMBER(parallel.sequence_parallel),
                   "split LayerNorms and the residual stream by rows too"));
  t.push_back(Num<int>(pa, "make_vocab_size_divisible_by",
                       ZR_MEMBER(parallel.make_vocab_size_divisible_by), 1, 1 << 16,
                       "the embedding is padded to a multiple of this x tensor size"));
  t.push_back(Num<int>(pa, "pipeline_parallel_size", ZR_MEMBER(parallel.pipeline_parallel_size), 1,
                       1 << 16, "pipeline stages"));
  t.push_back(Str(pa, "pipeline_schedule", ZR_MEMBER(parallel.pipeline_schedule),
                  {"gpipe", "1f1b", "interleaved"},
                  "the schedule of the step's micro-batches (gradient_accumulation_steps)"));
  t.push_back(Num<int>(pa, "virtual_pipeline_stages", ZR_MEMBER(parallel.virtual_pipeline_stages),
                       1, 1 << 10, "model chunks per stage (interleaved: 2 or more)"));
  t.push_back(With(
      Num<std::vector<int>>(pa, "pipeline_layers", ZR_MEMBER(parallel.pipeline_layers), 1, 1 << 16,
                            "blocks per chunk, pipeline_parallel_size x "
                            "virtual_pipeline_stages numbers summing to "
                            "model.n_layer; absent: an even split"),
      kNullWhenEmpty));
  t.push_back(Bool(pa, "pipeline_scatter_gather", ZR_MEMBER(parallel.pipeline_scatter_gather),
                   "each tensor-parallel rank sends 1/tp of a boundary activation (Megatron's "
                   "scatter/gather)"));
  t.push_back(Num<int>(pa, "data_shard_size", ZR_MEMBER(parallel.data_shard_size), 0, 1 << 16,
                       "hybrid sharding (FSDP's HSDP; MiCS): parameters, gradients and optimizer "
                       "state sharded over groups of this many consecutive data ranks (a node), "
                       "replicated across the groups; 0: over every data rank"));
  t.push_back(Num<double>(pa, "collective_timeout_s", ZR_MEMBER(parallel.collective_timeout_s), 0.1,
                          7 * 86400,
                          "seconds a collective may wait for its peers before the watchdog stops "
                          "every rank (exit 3)"));
  return t;
}

}  // namespace zerort::config_rows
