// Comparing a checkpoint's saved run config with a run's (config_match.h).
#include "zerort/checkpoint/config_match.h"

#include <array>
#include <map>
#include <span>

#include "zerort/config/config.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/strings.h"

namespace zerort {

namespace {

// The first of `keys` (section, key) whose value differs between `saved` and `now`, as
// "section.key = saved, this run's config has now"; empty when none does. A key the saved config
// lacks (written before the key existed) is not compared.
std::string FirstDifference(const nlohmann::json& saved, const nlohmann::json& now,
                            std::span<const std::array<const char*, 2>> keys) {
  for (const std::array<const char*, 2>& entry : keys) {
    const char* section = entry[0];  // named, not bound: clang before 16 cannot capture bindings
    const char* key = entry[1];
    auto at = [&](const nlohmann::json& j) {
      return j.is_object() && j.contains(section) && j[section].is_object() &&
                     j[section].contains(key)
                 ? j[section][key]
                 : nlohmann::json();
    };
    const nlohmann::json was = at(saved), is = at(now);
    if (!was.is_null() && was != is) {
      return StrCat(section, ".", key, " = ", was.dump(), ", this run's config has ", is.dump());
    }
  }
  return "";
}

// The model keys that give a checkpoint's tensors their shapes or their meaning.
constexpr std::array<const char*, 2> kArchitecture[] = {{"model", "arch"},
                                                        {"model", "n_layer"},
                                                        {"model", "n_head"},
                                                        {"model", "d_model"},
                                                        {"model", "vocab_size"},
                                                        {"model", "n_kv_head"},
                                                        {"model", "head_dim"},
                                                        {"model", "intermediate_size"},
                                                        {"model", "rope_theta"},
                                                        {"model", "rms_norm_eps"},
                                                        {"model", "tie_word_embeddings"},
                                                        {"model", "qkv_bias"},
                                                        {"model", "o_proj_bias"},
                                                        {"model", "mlp_bias"},
                                                        {"model", "qk_norm"},
                                                        {"model", "rope_scaling"},
                                                        {"model", "sliding_window"}};

}  // namespace

Status CheckResumable(const nlohmann::json& saved, const nlohmann::json& now,
                      const std::string& step_dir) {
  if (saved.is_null()) {
    return absl::InvalidArgumentError(
        StrCat("--resume: ", step_dir,
               " was saved by a trainer that embeds zerort (no run config): zerort train resumes "
               "only its own checkpoints"));
  }
  static constexpr std::array<const char*, 2> kRun[] = {
      {"model", "seq_len"}, {"optimizer", "type"}, {"bf16", "enabled"}};
  std::string diff = FirstDifference(saved, now, kArchitecture);
  if (diff.empty()) diff = FirstDifference(saved, now, kRun);
  if (!diff.empty()) {
    return absl::InvalidArgumentError(
        StrCat("--resume: ", step_dir, " was saved with ", diff,
               ": resume with the same value (the ZeRO stage, world size and layout, batch size "
               "and learning-rate schedule may change)"));
  }
  return absl::OkStatus();
}

Status CheckSameArchitecture(const nlohmann::json& saved, const nlohmann::json& now,
                             const std::string& step_dir, const std::string& command) {
  const std::string diff = FirstDifference(saved, now, kArchitecture);
  if (diff.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat(command, ": ", step_dir, " was saved with ", diff,
             ": the checkpoint's architecture is what its weights mean; set the key to the "
             "checkpoint's"));
}

Status CheckSavedParams(const nlohmann::json& metadata,
                        const std::vector<std::pair<std::string, Shape>>& params,
                        const std::string& step_dir) {
  const nlohmann::json saved = metadata.value("config", nlohmann::json());
  if (saved.is_null()) return absl::OkStatus();
  const std::string where = StrCat(step_dir, "/metadata.json");
  StatusOr<RunConfig> config = ParseRunConfig(saved, where);
  if (!config.ok()) {
    return absl::DataLossError(
        StrCat(where, ": its saved run config does not read: ", config.status().message()));
  }
  auto dims = [](const Shape& s) {
    return s.empty() ? std::string("scalar") : fmt::format("{}", fmt::join(s, "x"));
  };
  StatusOr<std::vector<DecoderUnit>> units = DecoderUnits(config->model.shape, 1, 0);
  if (!units.ok()) {
    return absl::DataLossError(
        StrCat(where, ": its saved run config's model: ", units.status().message()));
  }
  std::map<std::string, Shape> declared;
  for (const DecoderUnit& unit : *units) {
    for (const ParamSpec& p : unit.params) declared.emplace(p.name, p.real_shape());
  }
  for (const auto& [name, shape] : params) {
    auto d = declared.find(name);
    if (d == declared.end()) {
      return absl::DataLossError(
          StrCat(where, ": parameter '", name, "' is not one of its saved run config's model"));
    }
    if (d->second != shape) {
      return absl::DataLossError(StrCat(where, ": parameter '", name, "' has shape ", dims(shape),
                                        " where its saved run config's model has ",
                                        dims(d->second)));
    }
    declared.erase(d);
  }
  if (!declared.empty()) {
    return absl::DataLossError(StrCat(where, ": its saved run config's model has '",
                                      declared.begin()->first, "' (", declared.size(),
                                      " parameters in all) that the checkpoint does not save"));
  }
  return absl::OkStatus();
}

}  // namespace zerort
