// The config keys' own readers (config_readers.h).
#include "zerort/config/config_readers.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "zerort/layers/decoder_config.h"
#include "zerort/runtime/strings.h"

namespace zerort::config_readers {

Status ReadPreset(const JsonSection& s, std::string_view key, RunConfig& c) {
  std::string preset;
  ZR_RETURN_IF_ERROR(s.String(key, preset));
  if (preset.empty()) return absl::OkStatus();
  StatusOr<DecoderConfig> p = DecoderPreset(preset);
  if (!p.ok()) return absl::InvalidArgumentError(StrCat("model.preset: ", p.status().message()));
  c.model.shape = *p;  // the shape keys read after it override its values
  return absl::OkStatus();
}

// data.blend: [WEIGHT, PATH, WEIGHT, PATH, ...] (Megatron's data_path), each weight a positive
// number (or a string holding one), each path a non-empty string; at most 1024 files; [] none.
Status ReadBlend(const JsonSection& s, std::string_view key, RunConfig& c) {
  const nlohmann::json* v = s.Raw(key);
  if (v == nullptr) return absl::OkStatus();
  const std::string path = s.PathOf(key);
  if (v->is_array() && v->empty()) {  // the default, as printed: no blend
    c.data.blend.clear();
    return absl::OkStatus();
  }
  if (!v->is_array() || v->size() % 2 != 0 || v->size() > 2048) {
    return absl::InvalidArgumentError(
        StrCat(path, " = ", ShortDump(*v),
               ": expected a list [WEIGHT, PATH, WEIGHT, PATH, ...] of 1 to 1024 files"));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); i += 2) {
    const nlohmann::json& w = (*v)[i];
    const nlohmann::json& p = (*v)[i + 1];
    double weight = -1;
    if (w.is_number()) {
      weight = w.get<double>();
    } else if (w.is_string()) {
      const std::string text = w.get<std::string>();
      char* end = nullptr;
      weight = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size()) weight = -1;
    }
    if (!(weight > 0) || !std::isfinite(weight)) {
      return absl::InvalidArgumentError(
          StrCat(path, "[", i, "] = ", ShortDump(w), ": a weight must be a positive number"));
    }
    if (!p.is_string() || p.get<std::string>().empty() || p.get<std::string>().size() > 4096) {
      return absl::InvalidArgumentError(
          StrCat(path, "[", i + 1, "] = ", ShortDump(p), ": expected a file path (a string)"));
    }
    out.push_back(fmt::format("{}", weight));
    out.push_back(p.get<std::string>());
  }
  c.data.blend = std::move(out);
  return absl::OkStatus();
}

Status ReadRopeType(const JsonSection& s, std::string_view key, RunConfig& c) {
  std::string type;
  ZR_RETURN_IF_ERROR(s.String(key, type));
  const std::optional<RopeType> t = RopeTypeFromName(type);
  if (!t) {
    return absl::InvalidArgumentError(
        StrCat(s.PathOf(key), " = ", ShortDump(nlohmann::json(type)),
               ": zerort computes \"default\" (none), \"linear\", \"llama3\" (LLaMA 3.1's), "
               "\"yarn\" and \"dynamic\" (NTK); LongRoPE scaling is not implemented"));
  }
  c.model.shape.rope_scaling.type = *t;
  return absl::OkStatus();
}

Status ReadOptimizerType(const JsonSection& s, std::string_view key, RunConfig& c) {
  std::string type;
  ZR_RETURN_IF_ERROR(s.String(key, type));
  const std::string lower = absl::AsciiStrToLower(type);
  // DeepSpeed lowers optimizer names: its 1-bit optimizers are written in any case.
  for (const char* name : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    if (lower == absl::AsciiStrToLower(name)) {
      c.optimizer.type = name;
      return absl::OkStatus();
    }
  }
  if (type.empty()) return absl::OkStatus();
  return s.String(key, c.optimizer.type,
                  {"AdamW", "Adam", "SGD", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"});
}

Status ReadSchedulerType(const JsonSection& s, std::string_view key, RunConfig& c) {
  std::string type;
  ZR_RETURN_IF_ERROR(s.String(key, type));
  const std::string lower = absl::AsciiStrToLower(type);
  if (lower == "onecycle" || lower == "lrrangetest") {
    return absl::InvalidArgumentError(StrCat(
        "scheduler.type = \"", type,
        "\": a DeepSpeed scheduler zerort does not implement (it would train with other learning "
        "rates); use WarmupLR, WarmupDecayLR or WarmupCosineLR"));
  }
  return s.String(key, c.scheduler.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
}

}  // namespace zerort::config_readers
