// A Hugging Face model directory's config.json as a GptConfig: what `zerort estimate
// --hf-config` reads (and, later, checkpoint import). Untrusted input: the bounded JSON reader,
// every field type- and range-checked, the error naming the file and the key.
#pragma once

#include <string>

#include "layers/gpt_config.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

namespace zerort {

// LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (model_type "llama", "mistral",
// "qwen2") as model.arch llama; GPT2LMHeadModel ("gpt2") as gpt2. seq_len is
// max_position_embeddings (n_positions); a sliding window (Mistral's sliding_window) is refused
// when it is shorter than that, rope_scaling when set (neither is implemented), and so is
// head_dim unless it is hidden_size / num_attention_heads. `file` names the source in errors.
StatusOr<GptConfig> GptConfigFromHuggingFace(const nlohmann::json& config, const std::string& file);
// Reads `path` (a config.json, or a directory holding one) with the bounded JSON reader.
StatusOr<GptConfig> ReadHuggingFaceConfig(const std::string& path);
// The same file's JSON object as it is (a run keeps it for export: RunState::hf_config).
StatusOr<nlohmann::json> ReadHuggingFaceConfigJson(const std::string& path);

}  // namespace zerort
