// Exporting and evaluating checkpoints.
//
// ExportHuggingFace writes the fp32 master weights of a checkpoint as a Hugging Face GPT-2 model
// directory: model.safetensors (GPT-2's parameter names; the Conv1D weights of attention and MLP
// stored [in, out], as GPT-2 does; the output projection tied to transformer.wte, so no lm_head)
// and config.json. It streams one parameter at a time: the largest buffer is one parameter, never
// the model. Every shard file is checksummed before use.
//
// EvaluateCheckpoint: mean next-token cross-entropy of a checkpoint's weights over the first K
// non-overlapping windows of seq_len + 1 tokens from the start of a token file.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zerort {

struct ExportSummary {
  int tensors = 0;
  int64_t bytes = 0;
};
// `dtype` kF32 (the masters as they are), or kBF16 / kF16 (each value rounded to nearest even:
// DeepSpeed's 16-bit model save).
StatusOr<ExportSummary> ExportHuggingFace(const std::string& step_dir, const std::string& out_dir,
                                          DType dtype = DType::kF32);

struct EvalResult {
  double loss = 0;     // mean over tokens
  int64_t tokens = 0;  // windows x seq_len
  int64_t windows = 0;
};
StatusOr<EvalResult> EvaluateCheckpoint(const RunConfig& config, const std::string& step_dir,
                                        const std::string& data_path, int64_t max_windows);

}  // namespace zerort
