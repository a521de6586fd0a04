// DecoderConfig validation, counts and presets.
#include "zerort/layers/decoder_config.h"

#include <algorithm>
#include <cmath>

#include "zerort/runtime/strings.h"

namespace zerort {

std::string_view ModelArchName(ModelArch arch) {
  return arch == ModelArch::kLlama ? "llama" : "gpt2";
}

int64_t DecoderConfig::BlockParameters() const {
  const int64_t c = d_model;
  if (llama()) {
    const int64_t kv = static_cast<int64_t>(kv_heads()) * head_size(), f = intermediate_size;
    const int64_t a = attention_channels();
    // two RMSNorms, q, k, v, o, gate, up, down, the biases the flags give, q's and k's norms
    return 2 * c + c * (a + 2 * kv) + (qkv_bias ? a + 2 * kv : 0) + a * c + (o_proj_bias ? c : 0) +
           3 * c * f + (mlp_bias ? 2 * f + c : 0) + (qk_norm ? 2 * head_size() : 0);
  }
  // ln1, qkv (w + b), proj (w + b), ln2, fc (w + b), fc proj (w + b)
  return 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
}

BlockFeatures DecoderConfig::features() const {
  if (!llama()) return BlockFeatures{};  // GPT-2: LayerNorm, fused QKV, GELU, every bias
  return BlockFeatures{.norm = NormKind::kRmsNorm,
                       .qkv = QkvKind::kRotary,
                       .mlp = MlpKind::kSwiGlu,
                       .qkv_bias = qkv_bias,
                       .o_proj_bias = o_proj_bias,
                       .mlp_bias = mlp_bias,
                       .qk_norm = qk_norm};
}

int64_t DecoderConfig::NumParameters() const {
  const int64_t c = d_model, embedding = static_cast<int64_t>(vocab_size) * c;
  if (llama()) {  // wte, the blocks, the final RMSNorm, lm_head unless tied
    return embedding + n_layer * BlockParameters() + c + (tied() ? 0 : embedding);
  }
  return embedding + static_cast<int64_t>(seq_len) * c + n_layer * BlockParameters() + 2 * c;
}

double DecoderConfig::FlopsPerToken() const {
  // The lookups are not GEMMs: GPT-2's positions, and an untied model's input embedding.
  int64_t lookups = learned_positions() ? static_cast<int64_t>(seq_len) * d_model : 0;
  if (!tied()) lookups += static_cast<int64_t>(vocab_size) * d_model;
  const double n = static_cast<double>(NumParameters() - lookups);
  return 6.0 * n + 12.0 * n_layer * attention_channels() * static_cast<double>(seq_len);
}

std::string DecoderConfig::Describe() const {
  return StrCat(ModelArchName(arch), ", ", n_layer, " layers, d ", d_model, ", ", n_head, " heads",
                llama() && kv_heads() != n_head ? StrCat(" (", kv_heads(), " KV)") : "",
                head_dim > 0 ? StrCat(" of ", head_dim) : "", ", seq ", seq_len,
                rope_scaling.type != RopeType::kDefault
                    ? StrCat(", rope ", RopeScalingText(rope_scaling))
                    : "");
}

Status ValidateRopeScaling(const RopeScaling& s) {
  const char* const k = "model.rope_scaling.";
  auto number = [&](const char* key, double v, double lo, const char* what) -> Status {
    if (v >= lo && std::isfinite(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(StrCat(k, key, " = ", v, ": ", what));
  };
  auto unused = [&](const char* key, bool set) -> Status {
    if (!set) return absl::OkStatus();
    return absl::InvalidArgumentError(StrCat(k, key, " is set, and ", k, "rope_type is \"",
                                             RopeTypeName(s.type), "\", which does not read it"));
  };
  auto context = [&]() -> Status {
    if (s.original_max_position_embeddings >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        StrCat(k, "original_max_position_embeddings = ", s.original_max_position_embeddings,
               ": must be >= 1 (the context trained on)"));
  };
  const bool llama3 = s.type == RopeType::kLlama3, yarn = s.type == RopeType::kYarn,
             dynamic = s.type == RopeType::kDynamic;
  switch (s.type) {
    case RopeType::kDefault:
      ZR_RETURN_IF_ERROR(unused("factor", s.factor != 0));
      break;
    case RopeType::kLinear:
      ZR_RETURN_IF_ERROR(number("factor", s.factor, 1, "must be a finite number >= 1"));
      break;
    case RopeType::kLlama3:
      ZR_RETURN_IF_ERROR(number("factor", s.factor, 1, "must be a finite number >= 1"));
      if (!(s.low_freq_factor > 0) || !std::isfinite(s.low_freq_factor)) {
        return absl::InvalidArgumentError(
            StrCat(k, "low_freq_factor = ", s.low_freq_factor, ": must be a finite number > 0"));
      }
      if (!(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor)) {
        return absl::InvalidArgumentError(StrCat(k, "high_freq_factor = ", s.high_freq_factor,
                                                 ": must be a finite number above ", k,
                                                 "low_freq_factor = ", s.low_freq_factor));
      }
      ZR_RETURN_IF_ERROR(context());
      break;
    case RopeType::kYarn: {
      ZR_RETURN_IF_ERROR(number("factor", s.factor, 1, "must be a finite number >= 1"));
      ZR_RETURN_IF_ERROR(context());
      ZR_RETURN_IF_ERROR(number("attention_factor", s.attention_factor, 0,
                                "must be a finite number > 0 (0 or unset: from factor)"));
      ZR_RETURN_IF_ERROR(
          number("beta_slow", s.beta_slow, 0, "must be a finite number > 0 (0 or unset: 1)"));
      ZR_RETURN_IF_ERROR(
          number("beta_fast", s.beta_fast, 0, "must be a finite number > 0 (0 or unset: 32)"));
      const double fast = YarnBetaFast(s), slow = YarnBetaSlow(s);
      if (!(fast > slow)) {
        return absl::InvalidArgumentError(StrCat(k, "beta_fast = ", fast, " must be above ", k,
                                                 "beta_slow = ", slow,
                                                 " (the pairs kept turn more often than those "
                                                 "interpolated)"));
      }
      ZR_RETURN_IF_ERROR(number("mscale", s.mscale, 0, "must be a finite number >= 0"));
      ZR_RETURN_IF_ERROR(
          number("mscale_all_dim", s.mscale_all_dim, 0, "must be a finite number >= 0"));
      break;
    }
    case RopeType::kDynamic:
      ZR_RETURN_IF_ERROR(number("factor", s.factor, 1, "must be a finite number >= 1"));
      ZR_RETURN_IF_ERROR(context());
      break;
  }
  if (!llama3) {
    ZR_RETURN_IF_ERROR(unused("low_freq_factor", s.low_freq_factor != 0));
    ZR_RETURN_IF_ERROR(unused("high_freq_factor", s.high_freq_factor != 0));
  }
  if (!llama3 && !yarn && !dynamic) {
    ZR_RETURN_IF_ERROR(
        unused("original_max_position_embeddings", s.original_max_position_embeddings != 0));
  }
  if (!yarn) {
    ZR_RETURN_IF_ERROR(unused("attention_factor", s.attention_factor != 0));
    ZR_RETURN_IF_ERROR(unused("beta_fast", s.beta_fast != 0));
    ZR_RETURN_IF_ERROR(unused("beta_slow", s.beta_slow != 0));
    ZR_RETURN_IF_ERROR(unused("mscale", s.mscale != 0));
    ZR_RETURN_IF_ERROR(unused("mscale_all_dim", s.mscale_all_dim != 0));
  }
  return absl::OkStatus();
}

std::string RopeScalingText(const RopeScaling& s) {
  switch (s.type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return StrCat("linear x", s.factor);
    case RopeType::kLlama3:
      return StrCat("llama3 x", s.factor, " (low ", s.low_freq_factor, ", high ",
                    s.high_freq_factor, ", original ", s.original_max_position_embeddings, ")");
    case RopeType::kYarn:
      return StrCat("yarn x", s.factor, " (original ", s.original_max_position_embeddings,
                    ", beta ", YarnBetaFast(s), "/", YarnBetaSlow(s), ", attention factor ",
                    RopeAttentionFactor(Rope{.scaling = s}), ")");
    case RopeType::kDynamic:
      return StrCat("dynamic x", s.factor, " (original ", s.original_max_position_embeddings, ")");
  }
  return "?";
}

std::string_view RopeTypeName(RopeType type) {
  return type == RopeType::kLinear    ? "linear"
         : type == RopeType::kLlama3  ? "llama3"
         : type == RopeType::kYarn    ? "yarn"
         : type == RopeType::kDynamic ? "dynamic"
                                      : "default";
}

std::optional<RopeType> RopeTypeFromName(std::string_view name) {
  if (name == "default") return RopeType::kDefault;
  if (name == "linear") return RopeType::kLinear;
  if (name == "llama3") return RopeType::kLlama3;
  if (name == "yarn") return RopeType::kYarn;
  if (name == "dynamic") return RopeType::kDynamic;
  return std::nullopt;
}

int64_t PaddedVocab(const DecoderConfig& config, int tp, int vocab_multiple) {
  const int64_t m = static_cast<int64_t>(std::max(tp, 1)) * std::max(vocab_multiple, 1);
  return (config.vocab_size + m - 1) / m * m;
}

Status DecoderConfig::Validate() const {
  auto positive = [](const char* key, int v) -> Status {
    if (v < 1) return absl::InvalidArgumentError(StrCat("model.", key, " = ", v, ": must be >= 1"));
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(positive("n_layer", n_layer));
  ZR_RETURN_IF_ERROR(positive("n_head", n_head));
  ZR_RETURN_IF_ERROR(positive("d_model", d_model));
  ZR_RETURN_IF_ERROR(positive("seq_len", seq_len));
  ZR_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  if (head_dim < 0 || head_dim > (1 << 16)) {
    return absl::InvalidArgumentError(
        StrCat("model.head_dim = ", head_dim, ": must be in [0, 65536] (0: d_model / n_head)"));
  }
  if (int64_t{n_head} * head_size() > (1 << 20)) {  // attention_channels() is an int
    return absl::InvalidArgumentError(StrCat("model.n_head x model.head_dim = ", n_head, " x ",
                                             head_size(), ": at most 1048576 attention channels"));
  }
  if (head_dim == 0 && d_model % n_head != 0) {
    return absl::InvalidArgumentError(StrCat("model.n_head = ", n_head,
                                             " does not divide model.d_model = ", d_model,
                                             llama() ? " (or set model.head_dim)" : ""));
  }
  if (!llama()) {
    // The LLaMA keys have no meaning for GPT-2: set, they would be silently ignored.
    const char* set = n_kv_head != 0                  ? "n_kv_head"
                      : head_dim != 0                 ? "head_dim"
                      : intermediate_size != 0        ? "intermediate_size"
                      : rope_theta != 10000.0         ? "rope_theta"
                      : norm_eps != 1e-5              ? "rms_norm_eps"
                      : tie_word_embeddings           ? "tie_word_embeddings"
                      : qkv_bias                      ? "qkv_bias"
                      : o_proj_bias                   ? "o_proj_bias"
                      : mlp_bias                      ? "mlp_bias"
                      : qk_norm                       ? "qk_norm"
                      : sliding_window != 0           ? "sliding_window"
                      : rope_scaling != RopeScaling{} ? "rope_scaling"
                                                      : nullptr;
    if (set != nullptr) {
      return absl::InvalidArgumentError(
          StrCat("model.", set,
                 " is a LLaMA key, and model.arch is \"gpt2\" (set model.arch: \"llama\")"));
    }
    return absl::OkStatus();
  }
  if (n_kv_head < 0 || n_head % kv_heads() != 0) {
    return absl::InvalidArgumentError(StrCat("model.n_kv_head = ", n_kv_head,
                                             ": must divide model.n_head = ", n_head,
                                             " (grouped-query attention; 0: n_head)"));
  }
  if (head_size() % 2 != 0) {
    return absl::InvalidArgumentError(
        StrCat(head_dim > 0 ? "model.head_dim = " : "model.d_model / model.n_head = ", head_size(),
               ": rotary embeddings rotate pairs of channels, so the head size must be even"));
  }
  if (intermediate_size < 1) {
    return absl::InvalidArgumentError(StrCat("model.intermediate_size = ", intermediate_size,
                                             ": a LLaMA model needs its MLP width (>= 1)"));
  }
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        StrCat("model.rope_theta = ", rope_theta, ": must be a finite number above 1"));
  }
  ZR_RETURN_IF_ERROR(ValidateRopeScaling(rope_scaling));
  if (!(norm_eps > 0.0) || !(norm_eps < 1.0)) {
    return absl::InvalidArgumentError(
        StrCat("model.rms_norm_eps = ", norm_eps, ": must be in (0, 1)"));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        StrCat("model.sliding_window = ", sliding_window, ": must be >= 0 (0: none)"));
  }
  if (sliding_window > 0 && seq_len > sliding_window) {  // [Note: sliding windows]
    return absl::InvalidArgumentError(StrCat(
        "model.seq_len = ", seq_len, " is longer than model.sliding_window = ", sliding_window,
        ": sliding-window attention is not implemented (up to the window, "
        "full causal attention computes it exactly: set seq_len <= ",
        sliding_window, ")"));
  }
  return absl::OkStatus();
}

namespace {
struct Preset {
  const char* name;
  DecoderConfig config;
};
const Preset kPresets[] = {
    {"tiny",
     DecoderConfig{.n_layer = 2, .n_head = 4, .d_model = 64, .seq_len = 64, .vocab_size = 256}},
    {"gpt2", DecoderConfig{12, 12, 768, 1024, 50257}},
    {"gpt2-medium", DecoderConfig{24, 16, 1024, 1024, 50257}},
    {"gpt2-large", DecoderConfig{36, 20, 1280, 1024, 50257}},
    {"gpt2-xl", DecoderConfig{48, 25, 1600, 1024, 50257}},
    {"llama-tiny", DecoderConfig{.n_layer = 2,
                                 .n_head = 4,
                                 .d_model = 64,
                                 .seq_len = 64,
                                 .vocab_size = 256,
                                 .arch = ModelArch::kLlama,
                                 .n_kv_head = 2,
                                 .intermediate_size = 176}},
    // Shapes of published models (their config.json), for the estimator; the weights are theirs.
    {"llama-3.2-1b", DecoderConfig{.n_layer = 16,
                                   .n_head = 32,
                                   .d_model = 2048,
                                   .seq_len = 131072,
                                   .vocab_size = 128256,
                                   .arch = ModelArch::kLlama,
                                   .n_kv_head = 8,
                                   .intermediate_size = 8192,
                                   .rope_theta = 500000.0,
                                   .rope_scaling = {.type = RopeType::kLlama3,
                                                    .factor = 32,
                                                    .low_freq_factor = 1,
                                                    .high_freq_factor = 4,
                                                    .original_max_position_embeddings = 8192},
                                   .tie_word_embeddings = true}},
    {"llama-3-8b", DecoderConfig{.n_layer = 32,
                                 .n_head = 32,
                                 .d_model = 4096,
                                 .seq_len = 8192,
                                 .vocab_size = 128256,
                                 .arch = ModelArch::kLlama,
                                 .n_kv_head = 8,
                                 .intermediate_size = 14336,
                                 .rope_theta = 500000.0}},
    {"llama-3-70b", DecoderConfig{.n_layer = 80,
                                  .n_head = 64,
                                  .d_model = 8192,
                                  .seq_len = 8192,
                                  .vocab_size = 128256,
                                  .arch = ModelArch::kLlama,
                                  .n_kv_head = 8,
                                  .intermediate_size = 28672,
                                  .rope_theta = 500000.0}},
    {"qwen2-72b", DecoderConfig{.n_layer = 80,
                                .n_head = 64,
                                .d_model = 8192,
                                .seq_len = 32768,
                                .vocab_size = 152064,
                                .arch = ModelArch::kLlama,
                                .n_kv_head = 8,
                                .intermediate_size = 29568,
                                .rope_theta = 1000000.0,
                                .norm_eps = 1e-6,
                                .qkv_bias = true}},
    {"qwen3-8b", DecoderConfig{.n_layer = 36,
                               .n_head = 32,
                               .d_model = 4096,
                               .seq_len = 40960,
                               .vocab_size = 151936,
                               .arch = ModelArch::kLlama,
                               .n_kv_head = 8,
                               .intermediate_size = 12288,
                               .rope_theta = 1000000.0,
                               .norm_eps = 1e-6,
                               .qk_norm = true}},
};
}  // namespace

std::vector<std::string> DecoderPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

StatusOr<DecoderConfig> DecoderPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown model '", name,
             "' (known: ", fmt::format("{}", fmt::join(DecoderPresetNames(), ", ")), ")"));
}

}  // namespace zerort
