// A Hugging Face model directory's config.json as a DecoderConfig: what `zerort estimate
// --hf-config` reads (and, later, checkpoint import). Untrusted input: the bounded JSON reader,
// every field type- and range-checked, the error naming the file and the key.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "zerort/layers/decoder_config.h"
#include "zerort/runtime/status.h"

namespace zerort {

// LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (model_type "llama", "mistral",
// "qwen2") as model.arch llama; GPT2LMHeadModel ("gpt2") as gpt2. Every key zerort's model
// depends on is read, an absent one taking transformers' default for the model_type, or the
// config is refused naming the key (an activation or a rotary scaling zerort does not compute).
// seq_len is max_position_embeddings (n_positions), or a sliding window when that is shorter
// ([Note: sliding windows] in layers/decoder_config.h). `file` names the source in errors.
StatusOr<DecoderConfig> DecoderConfigFromHuggingFace(const nlohmann::json& config,
                                                     const std::string& file);
// Reads `path` (a config.json, or a directory holding one) with the bounded JSON reader.
StatusOr<DecoderConfig> ReadHuggingFaceConfig(const std::string& path);
// The same file's JSON object as it is (a run keeps it for export: RunState::hf_config).
StatusOr<nlohmann::json> ReadHuggingFaceConfigJson(const std::string& path);

}  // namespace zerort
