// Parameter names: zerort's and Hugging Face's (hf_names.h).
#include "zerort/checkpoint/hf_names.h"

#include <span>
#include <utility>

#include "zerort/runtime/strings.h"

namespace zerort {

std::string HfBasePrefix(ModelArch arch) {
  return arch == ModelArch::kLlama ? "model." : "transformer.";
}

StatusOr<HfName> ToHuggingFace(const std::string& ours, ModelArch arch) {
  const bool llama = arch == ModelArch::kLlama;
  if (llama) {
    if (ours == "wte") return HfName{"model.embed_tokens.weight"};
    if (ours == "norm.weight") return HfName{"model.norm.weight"};
    if (ours == "lm_head.weight") return HfName{"lm_head.weight"};
  } else {
    if (ours == "wte") return HfName{"transformer.wte.weight"};
    if (ours == "wpe") return HfName{"transformer.wpe.weight"};
    if (ours == "ln_f.weight") return HfName{"transformer.ln_f.weight"};
    if (ours == "ln_f.bias") return HfName{"transformer.ln_f.bias"};
  }
  // blocks.<i>.<part>.<weight|bias>
  const std::string prefix = "blocks.";
  if (ours.rfind(prefix, 0) == 0) {
    const size_t dot = ours.find('.', prefix.size());
    const std::string layer = ours.substr(prefix.size(), dot - prefix.size());
    const std::string rest = dot == std::string::npos ? "" : ours.substr(dot + 1);
    using Part = std::pair<const char*, const char*>;
    static const Part kGpt2[] = {{"ln1.", "ln_1."},
                                 {"ln2.", "ln_2."},
                                 {"attn.qkv.", "attn.c_attn."},
                                 {"attn.proj.", "attn.c_proj."},
                                 {"mlp.fc.", "mlp.c_fc."},
                                 {"mlp.proj.", "mlp.c_proj."}};
    static const Part kLlama[] = {
        {"attn_norm.", "input_layernorm."},   {"attn.q.", "self_attn.q_proj."},
        {"attn.k.", "self_attn.k_proj."},     {"attn.v.", "self_attn.v_proj."},
        {"attn.o.", "self_attn.o_proj."},     {"mlp_norm.", "post_attention_layernorm."},
        {"mlp.gate.", "mlp.gate_proj."},      {"mlp.up.", "mlp.up_proj."},
        {"mlp.down.", "mlp.down_proj."},      {"attn.q_norm.", "self_attn.q_norm."},
        {"attn.k_norm.", "self_attn.k_norm."}};
    for (const auto& [from, to] :
         llama ? std::span<const Part>(kLlama) : std::span<const Part>(kGpt2)) {
      const std::string f = from;
      if (rest.rfind(f, 0) != 0) continue;
      const std::string leaf = rest.substr(f.size());
      if (llama) return HfName{StrCat("model.layers.", layer, ".", to, leaf)};
      const bool linear_weight = leaf == "weight" && f.rfind("ln", 0) != 0;
      return HfName{StrCat("transformer.h.", layer, ".", to, leaf), linear_weight};
    }
  }
  return absl::InvalidArgumentError(
      StrCat("no Hugging Face ", ModelArchName(arch), " name for parameter '", ours, "'"));
}

}  // namespace zerort
