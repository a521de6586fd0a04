// Hugging Face config.json -> DecoderConfig (hf_config.h).
#include "zerort/checkpoint/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>

#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// transformers' defaults for the keys a config.json may leave out, per model_type (its
// configuration_llama.py, configuration_mistral.py, configuration_qwen2.py, configuration_qwen3.py
// and configuration_gpt2.py): an absent key means what it means to transformers.
struct Defaults {
  int vocab, hidden, intermediate, layers, heads, kv_heads, positions;
  double rms_norm_eps, rope_theta;
  int head_dim = 0;  // 0: hidden_size / num_attention_heads
};
Defaults DefaultsOf(const std::string& type) {
  if (type == "qwen3") return {151936, 4096, 22016, 32, 32, 32, 32768, 1e-6, 10000.0, 128};
  if (type == "mistral") return {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-6, 10000.0};
  if (type == "qwen2") return {151936, 4096, 22016, 32, 32, 32, 32768, 1e-6, 10000.0};
  // llama; num_key_value_heads None: num_attention_heads (0 here).
  return {32000, 4096, 11008, 32, 32, 0, 2048, 1e-6, 10000.0};
}

class Reader {
 public:
  Reader(const nlohmann::json& j, const std::string& file) : j_(j), file_(file) {}
  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // An integer key; `fallback` (transformers' default) when absent. A null is refused where
  // transformers would carry None into the model.
  StatusOr<int> Int(const char* key, int64_t lo, int64_t hi, std::optional<int> fallback) const {
    if (!j_.contains(key)) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer()) return Error(key, StrCat("= ", ShortDump(v), ": not an integer"));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return Error(key, StrCat("= ", x, ": must be in [", lo, ", ", hi, "]"));
    return static_cast<int>(x);
  }
  StatusOr<double> Number(const nlohmann::json& v, const std::string& key, double lo,
                          double hi) const {
    if (!v.is_number()) return Error(key, StrCat("= ", ShortDump(v), ": not a number"));
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      return Error(key, StrCat("= ", x, ": must be in [", lo, ", ", hi, "]"));
    }
    return x;
  }
  StatusOr<double> Number(const char* key, double lo, double hi, double fallback) const {
    if (!j_.contains(key)) return fallback;
    return Number(j_.at(key), key, lo, hi);
  }
  // A boolean key; `fallback` (transformers' default) when absent. A null is transformers' None,
  // which its models test as false (a GPT-2 with "tie_word_embeddings": null is untied), so it
  // reads as false, not as the default.
  StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!j_.contains(key)) return fallback;
    if (j_.at(key).is_null()) return false;
    if (!j_.at(key).is_boolean()) {
      return Error(key, StrCat("= ", ShortDump(j_.at(key)), ": not a boolean"));
    }
    return j_.at(key).get<bool>();
  }
  StatusOr<std::string> String(const char* key, const std::string& fallback) const {
    if (!Has(key)) return fallback;
    if (!j_.at(key).is_string()) {
      return Error(key, StrCat("= ", ShortDump(j_.at(key)), ": not a string"));
    }
    return j_.at(key).get<std::string>();
  }
  // The key's value as the file has it (for messages).
  std::string Shown(const char* key) const { return ShortDump(j_.value(key, nlohmann::json())); }
  Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(StrCat(file_, ": ", key, " ", what));
  }

 private:
  const nlohmann::json& j_;
  const std::string& file_;
};

// YaRN's keys past its factor ([Note: rotary scaling], kernels/rope.h): each optional one absent
// or null is transformers' default (0 here: computed where the kernels read it).
StatusOr<RopeScaling> ReadYarn(const nlohmann::json& s, const std::string& key, const Reader& r,
                               int positions, RopeScaling out) {
  auto optional = [&](const char* name, double lo, double& to) -> Status {
    if (!s.contains(name) || s.at(name).is_null()) return absl::OkStatus();
    ZR_ASSIGN_OR_RETURN(to, r.Number(s.at(name), StrCat(key, ".", name), lo, 1e6));
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(optional("attention_factor", 1e-6, out.attention_factor));
  ZR_RETURN_IF_ERROR(optional("beta_fast", 1e-6, out.beta_fast));
  ZR_RETURN_IF_ERROR(optional("beta_slow", 1e-6, out.beta_slow));
  ZR_RETURN_IF_ERROR(optional("mscale", 0, out.mscale));
  ZR_RETURN_IF_ERROR(optional("mscale_all_dim", 0, out.mscale_all_dim));
  // transformers' defaults written out read as unset, so that a run config leaving them out is
  // the same model (model.init_from compares the two).
  if (out.beta_fast == kYarnBetaFast) out.beta_fast = 0;
  if (out.beta_slow == kYarnBetaSlow) out.beta_slow = 0;
  const double fast = YarnBetaFast(out), slow = YarnBetaSlow(out);
  if (!(fast > slow)) {
    return r.Error(StrCat(key, ".beta_fast"),
                   StrCat("= ", fast, ": must be above beta_slow = ", slow));
  }
  if (s.contains("truncate") && s.at("truncate") != nlohmann::json(true)) {
    return r.Error(StrCat(key, ".truncate"),
                   StrCat("= ", ShortDump(s.at("truncate")),
                          ": zerort's YaRN rounds the ramp's ends to whole pairs (truncate: "
                          "true); an unrounded ramp is not implemented"));
  }
  out.original_max_position_embeddings = positions;
  const std::string context = StrCat(key, ".original_max_position_embeddings");
  if (s.contains("original_max_position_embeddings") &&
      !s.at("original_max_position_embeddings").is_null()) {
    const nlohmann::json& v = s.at("original_max_position_embeddings");
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24)) {
      return r.Error(context, StrCat("= ", ShortDump(v), ": must be an integer in [1, 16777216]"));
    }
    out.original_max_position_embeddings = v.get<int>();
  }
  return out;
}

// A rope_scaling object (or transformers 5's rope_parameters) as a RopeScaling ([Note: rotary
// scaling] in kernels/rope.h): "default" (or a null) none, "linear", "llama3", "yarn" and
// "dynamic" with the parameters transformers requires of them (YaRN's original context
// `positions`, the config's max_position_embeddings, where it has none; dynamic's always
// `positions`); another rope_type is refused by name.
StatusOr<RopeScaling> ReadRopeScaling(const nlohmann::json& s, const std::string& key,
                                      const Reader& r, int positions) {
  RopeScaling out;
  if (s.is_null()) return out;
  if (!s.is_object()) return r.Error(key, StrCat("= ", ShortDump(s), ": not an object"));
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
  const nlohmann::json type = s.value(type_key, nlohmann::json("default"));
  if (!type.is_string()) {
    return r.Error(StrCat(key, ".", type_key), StrCat("= ", ShortDump(type), ": not a string"));
  }
  const std::optional<RopeType> t = RopeTypeFromName(type.get<std::string>());
  if (!t) {
    return r.Error(StrCat(key, ".", type_key),
                   StrCat("= ", ShortDump(type),
                          ": zerort computes default, linear, llama3 (LLaMA 3.1's), yarn and "
                          "dynamic (NTK) rotary scaling; LongRoPE is not implemented"));
  }
  out.type = *t;
  if (out.type == RopeType::kDefault) return out;
  auto number = [&](const char* name, double lo) -> StatusOr<double> {
    if (!s.contains(name)) return r.Error(StrCat(key, ".", name), "is missing");
    return r.Number(s.at(name), StrCat(key, ".", name), lo, 1e6);
  };
  ZR_ASSIGN_OR_RETURN(out.factor, number("factor", 1));
  if (out.type == RopeType::kLinear) return out;
  if (out.type == RopeType::kYarn) return ReadYarn(s, key, r, positions, out);
  if (out.type == RopeType::kDynamic) {
    // transformers' dynamic NTK scales from max_position_embeddings: an
    // original_max_position_embeddings in rope_scaling is not read there, nor here.
    out.original_max_position_embeddings = positions;
    return out;
  }
  ZR_ASSIGN_OR_RETURN(out.low_freq_factor, number("low_freq_factor", 1e-6));
  ZR_ASSIGN_OR_RETURN(out.high_freq_factor, number("high_freq_factor", 1e-6));
  if (!(out.high_freq_factor > out.low_freq_factor)) {
    return r.Error(StrCat(key, ".high_freq_factor"),
                   StrCat("= ", out.high_freq_factor,
                          ": must be above low_freq_factor = ", out.low_freq_factor));
  }
  const std::string context = StrCat(key, ".original_max_position_embeddings");
  if (!s.contains("original_max_position_embeddings")) return r.Error(context, "is missing");
  const nlohmann::json& v = s.at("original_max_position_embeddings");
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24)) {
    return r.Error(context, StrCat("= ", ShortDump(v), ": must be an integer in [1, 16777216]"));
  }
  out.original_max_position_embeddings = v.get<int>();
  return out;
}

// The rotary embeddings: rope_theta and rope_scaling at the top level (transformers 4), or inside
// rope_parameters (transformers 5: {"rope_type", "rope_theta", "factor", ...}); both spellings
// read, a disagreement between them refused.
Status ReadRope(const nlohmann::json& j, const Reader& r, double fallback, DecoderConfig& c) {
  const nlohmann::json none;
  const nlohmann::json& params = j.contains("rope_parameters") ? j.at("rope_parameters") : none;
  if (!params.is_null() && !params.is_object()) {
    return r.Error("rope_parameters", StrCat("= ", ShortDump(params), ": not an object"));
  }
  ZR_ASSIGN_OR_RETURN(c.rope_theta, r.Number("rope_theta", 1, 1e12, fallback));
  if (params.is_object() && params.contains("rope_theta")) {
    ZR_ASSIGN_OR_RETURN(const double theta,
                        r.Number(params.at("rope_theta"), "rope_parameters.rope_theta", 1, 1e12));
    if (j.contains("rope_theta") && theta != c.rope_theta) {
      return r.Error("rope_parameters.rope_theta",
                     StrCat("= ", theta, " disagrees with rope_theta = ", c.rope_theta));
    }
    c.rope_theta = theta;
  }
  const nlohmann::json& scaling = j.contains("rope_scaling") ? j.at("rope_scaling") : none;
  ZR_ASSIGN_OR_RETURN(c.rope_scaling, ReadRopeScaling(scaling, "rope_scaling", r, c.seq_len));
  if (params.is_object()) {
    ZR_ASSIGN_OR_RETURN(const RopeScaling p,
                        ReadRopeScaling(params, "rope_parameters", r, c.seq_len));
    if (!scaling.is_null() && p != c.rope_scaling) {
      return r.Error("rope_parameters",
                     StrCat("(", RopeScalingText(p), ") disagrees with rope_scaling (",
                            RopeScalingText(c.rope_scaling), ")"));
    }
    c.rope_scaling = p;
  }
  return absl::OkStatus();
}

StatusOr<DecoderConfig> Gpt2FromHuggingFace(const Reader& r) {
  DecoderConfig c;  // GPT2Config's defaults: 12 x 768, 12 heads, 1024 positions, 50257 tokens
  ZR_ASSIGN_OR_RETURN(c.n_layer, r.Int("n_layer", 1, 1 << 16, 12));
  ZR_ASSIGN_OR_RETURN(c.n_head, r.Int("n_head", 1, 1 << 16, 12));
  ZR_ASSIGN_OR_RETURN(c.d_model, r.Int("n_embd", 1, 1 << 20, 768));
  ZR_ASSIGN_OR_RETURN(c.seq_len, r.Int("n_positions", 1, 1 << 24, 1024));
  ZR_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 1, 1 << 24, 50257));
  if (r.Has("n_inner")) {  // zerort's GPT-2 MLP is 4 n_embd wide
    ZR_ASSIGN_OR_RETURN(const int inner, r.Int("n_inner", 1, 1 << 24, std::nullopt));
    if (int64_t{inner} != 4 * int64_t{c.d_model}) {
      return r.Error(
          "n_inner",
          StrCat("= ", inner, ": zerort's GPT-2 MLP is 4 x n_embd = ", 4 * int64_t{c.d_model}));
    }
  }
  // zerort's GPT-2 GELU is the tanh approximation (gelu_new, gelu_pytorch_tanh: one function).
  ZR_ASSIGN_OR_RETURN(const std::string act, r.String("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return r.Error("activation_function",
                   StrCat("= \"", act,
                          "\": zerort's GPT-2 MLP computes gelu_new (GELU's tanh "
                          "approximation); another activation is not implemented"));
  }
  // transformers' GPT-2 divides its attention scores by sqrt(head size) unless scale_attn_weights
  // is false, and also by the layer's index + 1 with scale_attn_by_inverse_layer_idx (Stanford
  // CRFM's Mistral GPT-2 runs): zerort's computes the first alone.
  ZR_ASSIGN_OR_RETURN(const bool scaled, r.Bool("scale_attn_weights", true));
  if (!scaled) {
    return r.Error("scale_attn_weights",
                   StrCat("= ", r.Shown("scale_attn_weights"),
                          ": zerort's GPT-2 attention divides its scores by sqrt(head size); "
                          "unscaled scores are not implemented"));
  }
  ZR_ASSIGN_OR_RETURN(const bool by_layer, r.Bool("scale_attn_by_inverse_layer_idx", false));
  if (by_layer) {
    return r.Error("scale_attn_by_inverse_layer_idx",
                   "= true: zerort's GPT-2 attention does not also divide its scores by the "
                   "layer's index + 1; that scaling is not implemented");
  }
  ZR_ASSIGN_OR_RETURN(const double eps, r.Number("layer_norm_epsilon", 0, 1, 1e-5));
  if (eps != 1e-5) {
    return r.Error("layer_norm_epsilon",
                   StrCat("= ", eps, ": zerort's GPT-2 LayerNorm uses 1e-05 (GPT-2's own)"));
  }
  // transformers unties GPT2LMHeadModel's lm_head when this is false (its own lm_head.weight in
  // the files); zerort's GPT-2 reads its logits through wte, so that model would not be this one.
  ZR_ASSIGN_OR_RETURN(const bool tied, r.Bool("tie_word_embeddings", true));
  if (!tied) {
    return r.Error("tie_word_embeddings",
                   StrCat("= ", r.Shown("tie_word_embeddings"),
                          ": zerort's GPT-2 ties its output projection to the token embedding "
                          "(wte); a GPT-2 with its own lm_head is not implemented"));
  }
  ZR_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

StatusOr<DecoderConfig> DecoderConfigFromHuggingFace(const nlohmann::json& j,
                                                     const std::string& file) {
  if (!j.is_object()) return absl::InvalidArgumentError(StrCat(file, ": not a JSON object"));
  const Reader r(j, file);
  std::string type;
  if (j.contains("model_type") && j.at("model_type").is_string()) {
    type = AsciiLower(j.at("model_type").get<std::string>());
  } else if (j.contains("architectures") && j.at("architectures").is_array() &&
             !j.at("architectures").empty() && j.at("architectures")[0].is_string()) {
    const std::string a = j.at("architectures")[0].get<std::string>();
    type = a == "GPT2LMHeadModel"      ? "gpt2"
           : a == "LlamaForCausalLM"   ? "llama"
           : a == "MistralForCausalLM" ? "mistral"
           : a == "Qwen2ForCausalLM"   ? "qwen2"
           : a == "Qwen3ForCausalLM"   ? "qwen3"
                                       : a;
  }
  if (type == "gpt2") return Gpt2FromHuggingFace(r);
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3") {
    return absl::InvalidArgumentError(
        StrCat(file, ": model_type ", type.empty() ? "(none)" : "\"" + type + "\"",
               " is not one zerort builds (llama, mistral, qwen2, qwen3: model.arch llama; "
               "gpt2)"));
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const Defaults d = DefaultsOf(type);
  DecoderConfig c;
  c.arch = ModelArch::kLlama;
  ZR_ASSIGN_OR_RETURN(c.n_layer, r.Int("num_hidden_layers", 1, 1 << 16, d.layers));
  ZR_ASSIGN_OR_RETURN(c.n_head, r.Int("num_attention_heads", 1, 1 << 16, d.heads));
  ZR_ASSIGN_OR_RETURN(c.d_model, r.Int("hidden_size", 1, 1 << 20, d.hidden));
  ZR_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size", 1, 1 << 24, d.intermediate));
  ZR_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 1, 1 << 24, d.vocab));
  ZR_ASSIGN_OR_RETURN(c.seq_len, r.Int("max_position_embeddings", 1, 1 << 24, d.positions));
  // num_key_value_heads: null or absent is transformers' default (LLaMA's: num_attention_heads).
  c.n_kv_head = d.kv_heads > 0 ? d.kv_heads : c.n_head;
  if (r.Has("num_key_value_heads")) {
    ZR_ASSIGN_OR_RETURN(c.n_kv_head, r.Int("num_key_value_heads", 1, 1 << 16, std::nullopt));
  }
  ZR_RETURN_IF_ERROR(ReadRope(j, r, d.rope_theta, c));
  ZR_ASSIGN_OR_RETURN(c.norm_eps, r.Number("rms_norm_eps", 0, 1, d.rms_norm_eps));
  ZR_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  // The MLP: SwiGLU, gate activated by hidden_act.
  ZR_ASSIGN_OR_RETURN(const std::string act, r.String("hidden_act", "silu"));
  if (act != "silu" && act != "swish") {
    return r.Error("hidden_act",
                   StrCat("= \"", act,
                          "\": zerort's LLaMA-family MLP gates with SiLU (silu); "
                          "a gate of another activation (GELU's: GeGLU) is not implemented"));
  }
  // Biases: Qwen2's Q/K/V biases are in its architecture, not its config (it has no others);
  // LLaMA's and Qwen3's attention_bias gives q, k, v and o_proj one, LLaMA's mlp_bias gate, up
  // and down_proj; Mistral has none (transformers ignores both keys for it and for Qwen2).
  c.qkv_bias = type == "qwen2";
  if (type == "llama" || type == "qwen3") {
    ZR_ASSIGN_OR_RETURN(const bool attention_bias, r.Bool("attention_bias", false));
    c.qkv_bias = c.o_proj_bias = attention_bias;
  }
  if (type == "llama") {
    ZR_ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
  }
  // Qwen3 RMSNorms each query and key head before the rotation (its q_norm, k_norm).
  c.qk_norm = type == "qwen3";
  // head_dim (null or absent: Qwen3's 128, the others' hidden_size / num_attention_heads): kept
  // only where it differs from the quotient, so a config that writes the quotient out is the same
  // model as one that does not (LLaMA 3.2's 64 = 2048 / 32).
  int head_dim = d.head_dim;
  if (r.Has("head_dim")) {
    ZR_ASSIGN_OR_RETURN(head_dim, r.Int("head_dim", 1, 1 << 16, std::nullopt));
  }
  if (head_dim > 0 && int64_t{head_dim} * c.n_head != c.d_model) c.head_dim = head_dim;
  // A sliding window ([Note: sliding windows] in layers/decoder_config.h): Mistral attends through
  // its sliding_window (4096 by default; null: none); Qwen2 only with use_sliding_window. The
  // model's context is then at most the window, where full causal attention is what they compute.
  bool windowed = type == "mistral";
  if (type == "qwen2" || type == "qwen3") {
    ZR_ASSIGN_OR_RETURN(windowed, r.Bool("use_sliding_window", false));
  }
  if (windowed && (!j.contains("sliding_window") || r.Has("sliding_window"))) {
    ZR_ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window", 1, kMaxInt, 4096));
    c.seq_len = std::min(c.seq_len, c.sliding_window);
  }
  if (const Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(StrCat(file, ": ", s.message()));
  }
  return c;
}

namespace {
std::string ConfigFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec)
             ? (std::filesystem::path(path) / "config.json").string()
             : path;
}
}  // namespace

StatusOr<nlohmann::json> ReadHuggingFaceConfigJson(const std::string& path) {
  JsonLimits limits;
  limits.max_bytes = int64_t{1} << 20;  // config.json files are a few KiB
  const std::string file = ConfigFile(path);
  ZR_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonFile(file, limits));
  if (!j.is_object()) return absl::InvalidArgumentError(StrCat(file, ": not a JSON object"));
  return j;
}

StatusOr<DecoderConfig> ReadHuggingFaceConfig(const std::string& path) {
  ZR_ASSIGN_OR_RETURN(const nlohmann::json j, ReadHuggingFaceConfigJson(path));
  return DecoderConfigFromHuggingFace(j, ConfigFile(path));
}

}  // namespace zerort
