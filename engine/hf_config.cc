// Hugging Face config.json -> GptConfig (hf_config.h).
#include "engine/hf_config.h"

#include <filesystem>
#include <limits>

#include "engine/json_reader.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

class Reader {
 public:
  Reader(const nlohmann::json& j, const std::string& file) : j_(j), file_(file) {}
  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  StatusOr<int> Int(const char* key, int64_t lo, int64_t hi) const {
    if (!Has(key)) return Error(key, "is missing");
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number_integer()) return Error(key, StrCat("= ", ShortDump(v), ": not an integer"));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return Error(key, StrCat("= ", x, ": must be in [", lo, ", ", hi, "]"));
    return static_cast<int>(x);
  }
  StatusOr<double> Number(const char* key, double lo, double hi) const {
    if (!Has(key)) return Error(key, "is missing");
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number()) return Error(key, StrCat("= ", ShortDump(v), ": not a number"));
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      return Error(key, StrCat("= ", x, ": must be in [", lo, ", ", hi, "]"));
    }
    return x;
  }
  StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!j_.at(key).is_boolean()) {
      return Error(key, StrCat("= ", ShortDump(j_.at(key)), ": not a boolean"));
    }
    return j_.at(key).get<bool>();
  }
  Status Error(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(StrCat(file_, ": ", key, " ", what));
  }

 private:
  const nlohmann::json& j_;
  const std::string& file_;
};

}  // namespace

StatusOr<GptConfig> GptConfigFromHuggingFace(const nlohmann::json& j, const std::string& file) {
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
                                       : a;
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  GptConfig c;
  if (type == "gpt2") {
    ZR_ASSIGN_OR_RETURN(c.n_layer, r.Int("n_layer", 1, 1 << 16));
    ZR_ASSIGN_OR_RETURN(c.n_head, r.Int("n_head", 1, 1 << 16));
    ZR_ASSIGN_OR_RETURN(c.d_model, r.Int("n_embd", 1, 1 << 20));
    ZR_ASSIGN_OR_RETURN(c.seq_len, r.Int("n_positions", 1, 1 << 24));
    ZR_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 1, 1 << 24));
    if (r.Has("n_inner")) {  // zerort's GPT-2 MLP is 4 n_embd wide
      ZR_ASSIGN_OR_RETURN(const int inner, r.Int("n_inner", 1, 1 << 24));
      if (int64_t{inner} != 4 * int64_t{c.d_model}) {
        return r.Error(
            "n_inner",
            StrCat("= ", inner, ": zerort's GPT-2 MLP is 4 x n_embd = ", 4 * int64_t{c.d_model}));
      }
    }
    ZR_RETURN_IF_ERROR(c.Validate());
    return c;
  }
  if (type != "llama" && type != "mistral" && type != "qwen2") {
    return absl::InvalidArgumentError(
        StrCat(file, ": model_type ", type.empty() ? "(none)" : "\"" + type + "\"",
               " is not one zerort builds (llama, mistral, qwen2: model.arch llama; gpt2)"));
  }
  c.arch = ModelArch::kLlama;
  ZR_ASSIGN_OR_RETURN(c.n_layer, r.Int("num_hidden_layers", 1, 1 << 16));
  ZR_ASSIGN_OR_RETURN(c.n_head, r.Int("num_attention_heads", 1, 1 << 16));
  ZR_ASSIGN_OR_RETURN(c.d_model, r.Int("hidden_size", 1, 1 << 20));
  ZR_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size", 1, 1 << 24));
  ZR_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 1, 1 << 24));
  ZR_ASSIGN_OR_RETURN(c.seq_len, r.Int("max_position_embeddings", 1, 1 << 24));
  c.n_kv_head = c.n_head;
  if (r.Has("num_key_value_heads")) {
    ZR_ASSIGN_OR_RETURN(c.n_kv_head, r.Int("num_key_value_heads", 1, 1 << 16));
  }
  if (r.Has("rope_theta")) {
    ZR_ASSIGN_OR_RETURN(c.rope_theta, r.Number("rope_theta", 1, 1e12));
  }
  if (r.Has("rms_norm_eps")) {
    ZR_ASSIGN_OR_RETURN(c.norm_eps, r.Number("rms_norm_eps", 0, 1));
  }
  ZR_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  // Qwen2's Q/K/V biases are in its architecture, not its config; LLaMA's attention_bias says.
  ZR_ASSIGN_OR_RETURN(c.qkv_bias, r.Bool("attention_bias", type == "qwen2"));
  if (r.Has("head_dim")) {
    ZR_ASSIGN_OR_RETURN(const int head_dim, r.Int("head_dim", 1, kMaxInt));
    if (int64_t{head_dim} * c.n_head != c.d_model) {
      return r.Error("head_dim", StrCat("= ", head_dim,
                                        ": zerort needs hidden_size / "
                                        "num_attention_heads = ",
                                        c.d_model / c.n_head));
    }
  }
  if (r.Has("rope_scaling")) {
    return r.Error("rope_scaling",
                   "is set: scaled rotary embeddings (LLaMA 3.1's, YaRN) are not "
                   "implemented; remove it to model the unscaled shape");
  }
  // Mistral attends through its sliding_window; Qwen2 only with use_sliding_window.
  bool windowed = type == "mistral";
  if (type == "qwen2") {
    ZR_ASSIGN_OR_RETURN(windowed, r.Bool("use_sliding_window", false));
  }
  if (windowed && r.Has("sliding_window")) {
    ZR_ASSIGN_OR_RETURN(const int window, r.Int("sliding_window", 1, kMaxInt));
    if (window < c.seq_len) {
      return r.Error("sliding_window",
                     StrCat("= ", window, " is shorter than the context (", c.seq_len,
                            "): sliding-window attention is not "
                            "implemented"));
    }
  }
  if (const Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(StrCat(file, ": ", s.message()));
  }
  return c;
}

StatusOr<GptConfig> ReadHuggingFaceConfig(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::is_directory(path, ec)
                               ? (std::filesystem::path(path) / "config.json").string()
                               : path;
  JsonLimits limits;
  limits.max_bytes = int64_t{1} << 20;  // config.json files are a few KiB
  ZR_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonFile(file, limits));
  return GptConfigFromHuggingFace(j, file);
}

}  // namespace zerort
