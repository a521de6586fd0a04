// Exporting and evaluating checkpoints.
//
// ExportHuggingFace writes the fp32 master weights of a checkpoint as a Hugging Face model
// directory, model.safetensors and config.json, with the names of checkpoint/hf_names.h: GPT-2
// (GPT2LMHeadModel: the Conv1D weights of attention and MLP stored [in, out], as GPT-2 does; the
// output projection tied to transformer.wte, so no lm_head) or the LLaMA family
// (LlamaForCausalLM; Qwen2ForCausalLM when it has Q/K/V biases; lm_head.weight unless tied). It
// streams one parameter at a time: the largest buffer is one parameter, never the model. Every
// shard file is checksummed before use.
//
// EvaluateCheckpoint: mean next-token cross-entropy of a checkpoint's weights over the first K
// non-overlapping windows of seq_len + 1 tokens from the start of a token file (with
// data.eod_mask_loss, over the targets the mask counts, as training counts them).
#pragma once

#include <cstdint>
#include <string>

#include "zerort/config/config.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort {

struct ExportSummary {
  int tensors = 0;
  int64_t bytes = 0;
  int files = 1;
};
// `dtype` kF32 (the masters as they are), or kBF16 / kF16 (each value rounded to nearest even:
// DeepSpeed's 16-bit model save). Above `max_shard_bytes` (Hugging Face's save_pretrained default,
// 5 GB) the tensors go to model-0000i-of-0000n.safetensors files, each filled up to it, with
// model.safetensors.index.json (its weight_map); below, one model.safetensors.
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;
StatusOr<ExportSummary> ExportHuggingFace(const std::string& step_dir, const std::string& out_dir,
                                          DType dtype = DType::kF32,
                                          int64_t max_shard_bytes = kDefaultMaxShardBytes);

// `zerort checkpoint import`: a Hugging Face model directory (config.json, safetensors; checked
// as model.init_from checks it, checkpoint/safetensors.h) as a zerort checkpoint OUT_DIR/step_0
// holding the master weights (optimizer SGD: no moments), which export, eval and inspect read
// at any layout. One process holds the model's fp32 masters while it writes them; to train from
// Hugging Face weights at any scale, model.init_from streams them per unit into the shards.
struct ImportSummary {
  std::string step_dir;
  int64_t parameters = 0;
};
StatusOr<ImportSummary> ImportHuggingFace(const std::string& hf_dir, const std::string& out_dir);

struct EvalResult {
  double loss = 0;     // mean over tokens
  int64_t tokens = 0;  // targets counted: windows x seq_len, less those eod_mask_loss masks
  int64_t windows = 0;
};
StatusOr<EvalResult> EvaluateCheckpoint(const RunConfig& config, const std::string& step_dir,
                                        const std::string& data_path, int64_t max_windows);

}  // namespace zerort
