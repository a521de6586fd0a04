// Reading RunConfig: --set overrides, the DeepSpeed front end, the field table and the rules;
// the batch triple.
#include "zerort/config/config.h"

#include "zerort/config/config_rules.h"
#include "zerort/config/config_schema.h"
#include "zerort/config/deepspeed_config.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status SetOverride(nlohmann::json& json, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        StrCat("--set '", assignment, "': expected path.to.key=value"));
  }
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  nlohmann::json value;
  JsonLimits limits;
  limits.top_level_object = false;
  StatusOr<nlohmann::json> parsed = ParseJsonText(text, StrCat("--set ", path), limits);
  if (parsed.ok()) {
    value = *std::move(parsed);
  } else if (!text.empty() && (text[0] == '[' || text[0] == '{')) {
    return parsed.status();  // meant as JSON: too deep, a duplicate key, not valid
  } else {
    value = text;  // a bare word is a string
  }
  try {
    (void)value.dump();  // throws on ill-formed UTF-8, which nothing downstream could print
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(
        StrCat("--set for '", path, "': the value is not valid UTF-8"));
  }
  nlohmann::json* node = &json;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot - start);
    if (key.empty())
      return absl::InvalidArgumentError(StrCat("--set '", assignment, "': empty key"));
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return absl::OkStatus();
    }
    nlohmann::json& child = (*node)[key];
    if (child.is_null()) child = nlohmann::json::object();
    if (!child.is_object()) {
      return absl::InvalidArgumentError(
          StrCat("--set '", assignment, "': ", path.substr(0, dot), " is not an object"));
    }
    node = &child;
    start = dot + 1;
  }
}

// The schema: every key's type and range (the field table), then the rules between keys.
RunConfig ParseSchema(const nlohmann::json& json, Problems& problems) {
  RunConfig c;
  GivenKeys given;
  ReadConfigFields(json, c, given, problems);
  CheckConfigRules(c, given, problems);
  return c;
}

}  // namespace

StatusOr<RunConfig> ParseRunConfig(const nlohmann::json& given, const std::string& file) {
  nlohmann::json json = given;
  Problems problems;
  std::vector<std::string> notes;
  AutoKeys autos;
  NormalizeDeepSpeed(json, problems, notes, autos);
  if (!autos.empty()) {
    // The rules read the rest of the config (model.d_model, the optimizer, train.steps).
    Problems ignored;
    const RunConfig first = ParseSchema(json, ignored);
    ResolveAutoValues(autos, first, json, notes);
  }
  RunConfig c = ParseSchema(json, problems);
  if (!problems.empty()) return problems.ToStatus(file);
  c.notes = std::move(notes);  // ParseSchema's own warnings are in c.warnings
  return c;
}

StatusOr<RunConfig> LoadRunConfig(const std::string& file,
                                  const std::vector<std::string>& overrides) {
  ZR_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonFile(file));
  for (const std::string& o : overrides) ZR_RETURN_IF_ERROR(SetOverride(json, o));
  return ParseRunConfig(json, file);
}

Status ResolveBatch(RunConfig& c, int dp, const std::string& dp_source) {
  int64_t& t = c.train_batch_size;
  int64_t& m = c.train_micro_batch_size_per_gpu;
  int64_t& a = c.gradient_accumulation_steps;
  const std::string numbers = StrCat("train_batch_size = ", t ? StrCat(t) : "unset",
                                     ", train_micro_batch_size_per_gpu = ", m ? StrCat(m) : "unset",
                                     ", gradient_accumulation_steps = ", a ? StrCat(a) : "unset",
                                     ", data-parallel size = ", dp, " (", dp_source, ")");
  auto fail = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("batch sizes do not multiply out: ", why, "; ",
                                             numbers,
                                             "; train_batch_size must equal micro x accumulation "
                                             "x data-parallel size"));
  };
  // How each value came to be, for the message when a derived one is out of range.
  std::string m_how = "as given", a_how = "as given";
  if (t && m && a) {
    if (t != m * a * dp) return fail(StrCat(m, " x ", a, " x ", dp, " = ", m * a * dp, " != ", t));
  } else if (t && m) {
    if (t % (m * dp) != 0) return fail(StrCat(t, " is not a multiple of ", m, " x ", dp));
    a = t / (m * dp);
    a_how =
        StrCat("= train_batch_size ", t, " / (micro-batch ", m, " x data-parallel size ", dp, ")");
  } else if (t && a) {
    if (t % (a * dp) != 0) return fail(StrCat(t, " is not a multiple of ", a, " x ", dp));
    m = t / (a * dp);
    m_how =
        StrCat("= train_batch_size ", t, " / (accumulation ", a, " x data-parallel size ", dp, ")");
  } else if (m) {
    if (!a) a = 1;
    if (m > kMaxConfigInt / a / dp) {
      return fail(StrCat(m, " x ", a, " x ", dp, " is more than 2^53 sequences per step"));
    }
    t = m * a * dp;
  } else if (t) {
    if (t % dp != 0) return fail(StrCat(t, " is not a multiple of ", dp));
    m = t / dp;
    a = 1;
    m_how = StrCat("= train_batch_size ", t, " / data-parallel size ", dp,
                   ", with no micro-batch or accumulation given");
  } else {
    return absl::InvalidArgumentError(
        StrCat("set train_micro_batch_size_per_gpu (and gradient_accumulation_steps or "
               "train_batch_size if you like); ",
               numbers));
  }
  // A rank runs at most 2^31 - 1 sequences per micro-batch and micro-batches per step.
  constexpr int64_t kMaxPerRank = 2147483647;
  if (m > kMaxPerRank) {
    return absl::InvalidArgumentError(
        StrCat("train_micro_batch_size_per_gpu ", m, " (", m_how,
               ") is more than 2147483647 sequences per rank and micro-batch; set "
               "train_micro_batch_size_per_gpu or gradient_accumulation_steps"));
  }
  if (a > kMaxPerRank) {
    return absl::InvalidArgumentError(StrCat("gradient_accumulation_steps ", a, " (", a_how,
                                             ") is more than 2147483647 micro-batches per step"));
  }
  return absl::OkStatus();
}

nlohmann::json RunConfig::ToJson() const { return FieldsToJson(*this); }

}  // namespace zerort
