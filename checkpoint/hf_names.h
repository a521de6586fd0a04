// zerort's parameter names and Hugging Face's (hf_names.cc): one table per architecture, read by
// checkpoint export (zerort -> HF) and by import / model.init_from (HF -> zerort).
#pragma once

#include <string>

#include "zerort/layers/decoder_config.h"
#include "zerort/runtime/status.h"

namespace zerort {

// A parameter's name in a Hugging Face model, and whether HF stores it transposed (GPT-2's
// Conv1D linear weights are [in, out]; zerort's, like nn.Linear's, [out, in]).
struct HfName {
  std::string name;
  bool transpose = false;
};
// GPT-2: "transformer.h.3.attn.c_attn.weight" (transposed) for "blocks.3.attn.qkv.weight";
// LLaMA family: "model.layers.3.self_attn.q_proj.weight" for "blocks.3.attn.q.weight",
// "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight".
StatusOr<HfName> ToHuggingFace(const std::string& ours, ModelArch arch);
// The prefix Hugging Face's base model adds ("transformer." or "model."): checkpoints saved from
// the base model (GPT-2's own files) leave it out, so a reader tries the name without it too.
std::string HfBasePrefix(ModelArch arch);

}  // namespace zerort
