// GptConfig validation, counts and presets.
#include "layers/gpt_config.h"

#include <algorithm>

#include "runtime/strings.h"

namespace zerort {

int64_t GptConfig::BlockParameters() const {
  const int64_t c = d_model;
  // ln1, qkv (w + b), proj (w + b), ln2, fc (w + b), fc proj (w + b)
  return 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
}

int64_t GptConfig::NumParameters() const {
  const int64_t c = d_model;
  return static_cast<int64_t>(vocab_size) * c + static_cast<int64_t>(seq_len) * c +
         n_layer * BlockParameters() + 2 * c;
}

double GptConfig::FlopsPerToken() const {
  const double n = static_cast<double>(NumParameters() - static_cast<int64_t>(seq_len) * d_model);
  return 6.0 * n + 12.0 * n_layer * d_model * static_cast<double>(seq_len);
}

int64_t PaddedVocab(const GptConfig& config, int tp, int vocab_multiple) {
  const int64_t m = static_cast<int64_t>(std::max(tp, 1)) * std::max(vocab_multiple, 1);
  return (config.vocab_size + m - 1) / m * m;
}

Status GptConfig::Validate() const {
  auto positive = [](const char* key, int v) -> Status {
    if (v < 1) return absl::InvalidArgumentError(StrCat("model.", key, " = ", v, ": must be >= 1"));
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(positive("n_layer", n_layer));
  ZR_RETURN_IF_ERROR(positive("n_head", n_head));
  ZR_RETURN_IF_ERROR(positive("d_model", d_model));
  ZR_RETURN_IF_ERROR(positive("seq_len", seq_len));
  ZR_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  if (d_model % n_head != 0) {
    return absl::InvalidArgumentError(
        StrCat("model.n_head = ", n_head, " does not divide model.d_model = ", d_model));
  }
  return absl::OkStatus();
}

namespace {
struct Preset {
  const char* name;
  GptConfig config;
};
const Preset kPresets[] = {
    {"tiny", GptConfig{.n_layer = 2, .n_head = 4, .d_model = 64, .seq_len = 64, .vocab_size = 256}},
    {"gpt2", GptConfig{12, 12, 768, 1024, 50257}},
    {"gpt2-medium", GptConfig{24, 16, 1024, 1024, 50257}},
    {"gpt2-large", GptConfig{36, 20, 1280, 1024, 50257}},
    {"gpt2-xl", GptConfig{48, 25, 1600, 1024, 50257}},
};
}  // namespace

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

StatusOr<GptConfig> GptPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown model '", name,
             "' (known: ", fmt::format("{}", fmt::join(GptPresetNames(), ", ")), ")"));
}

}  // namespace zerort
