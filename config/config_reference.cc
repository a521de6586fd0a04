// docs/config.md's reference, printed from the field table (config_schema.h).
#include <cmath>

#include "zerort/config/config_schema.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

std::string FormatNumber(double d) {
  if (d == kMaxConfigIntAsDouble) return "2^53";
  if (d == std::floor(d) && std::fabs(d) < 1e15) return StrCat(static_cast<int64_t>(d));
  return fmt::format("{}", d);
}

// A default as a reader writes it: a float member's value in its own shortest digits (0.0003,
// not 0.0003000000142492354).
std::string ShownDefault(const nlohmann::json& v) {
  if (v.is_array()) {
    std::string out;
    for (const nlohmann::json& e : v) out += StrCat(out.empty() ? "" : ", ", ShownDefault(e));
    return StrCat("[", out, "]");
  }
  if (!v.is_number_float()) return v.dump();
  const double d = v.get<double>();
  const float f = static_cast<float>(d);
  return static_cast<double>(f) == d ? fmt::format("{}", f) : fmt::format("{}", d);
}

}  // namespace

std::string ConfigReferenceMarkdown() {
  const RunConfig defaults;
  std::string out;
  std::string_view section = "-";
  for (const ConfigField& f : ConfigFields()) {
    if (f.section != section) {
      section = f.section;
      out +=
          StrCat(out.empty() ? "" : "\n", "### `", section.empty() ? "(top level)" : section,
                 "`\n\n| key | type | default | allowed | what it does |\n|---|---|---|---|---|\n");
    }
    std::string allowed;
    if (!f.choices.empty()) {
      for (std::string_view ch : f.choices) allowed += StrCat(allowed.empty() ? "" : ", ", ch);
    } else if (f.TypeName() == "integer" || f.TypeName() == "number" ||
               f.TypeName() == "two numbers" || f.TypeName() == "list of integers") {
      allowed = StrCat(FormatNumber(f.min), " .. ", FormatNumber(f.max));
    }
    std::string doc(f.doc);
    if (!f.owners.empty()) {
      std::string types;
      for (std::string_view o : f.owners) types += StrCat(types.empty() ? "" : ", ", o);
      doc += StrCat(" (", types, ")");
    }
    const nlohmann::json value = f.Value(defaults);
    const bool unset = (f.flags & kNotPrinted) || value.is_null() ||
                       (value.is_string() && value.get<std::string>().empty()) ||
                       ((f.flags & kOmitUnset) && value == 0);
    const std::string shown = unset ? "unset" : ShownDefault(value);
    out += StrCat("| `", f.key, "` | ", f.TypeName(), " | ", shown, " | ", allowed, " | ", doc,
                  " |\n");
  }
  return out;
}

}  // namespace zerort
