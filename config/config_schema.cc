// The field table (config_schema.h) and the reading, printing and reference built from it.
#include "zerort/config/config_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "zerort/config/config_rows.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

const std::vector<ConfigField>& Table() {
  static const std::vector<ConfigField> kTable = config_rows::BuildTable();
  return kTable;
}

// The type whose parameters a params section holds.
const std::string* OwnerType(std::string_view section, const RunConfig& c) {
  if (section == "optimizer.params") return &c.optimizer.type;
  if (section == "scheduler.params") return &c.scheduler.type;
  return nullptr;
}

bool Contains(const std::vector<std::string_view>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Status ReadList(const JsonSection& s, std::string_view key, std::vector<int>& out, double min,
                double max) {
  std::vector<double> values;
  ZR_RETURN_IF_ERROR(s.Numbers(key, values, 0, min, max));
  std::vector<int> ints;
  for (double v : values) {
    if (v != std::floor(v)) {
      return absl::InvalidArgumentError(StrCat(s.PathOf(key), ": ", v, " is not a whole number"));
    }
    ints.push_back(static_cast<int>(v));
  }
  out = std::move(ints);
  return absl::OkStatus();
}

Status ReadField(const ConfigField& f, const JsonSection& s, RunConfig& c) {
  if (f.read != nullptr) return f.read(s, f.key, c);
  std::vector<std::string> choices(f.choices.begin(), f.choices.end());
  return std::visit(
      [&](auto ref) -> Status {
        using Ref = decltype(ref);
        if constexpr (std::is_same_v<Ref, std::monostate>) {
          return absl::OkStatus();
        } else if constexpr (std::is_same_v<Ref, EnumRef>) {
          std::string name(f.choices.at(static_cast<size_t>(ref.get(c))));
          ZR_RETURN_IF_ERROR(s.String(f.key, name, choices));
          ref.set(c, static_cast<int>(std::find(choices.begin(), choices.end(), name) -
                                      choices.begin()));
          return absl::OkStatus();
        } else {
          auto& out = ref(c);
          using T = std::remove_reference_t<decltype(out)>;
          if constexpr (std::is_same_v<T, bool>) {
            return s.Bool(f.key, out);
          } else if constexpr (std::is_same_v<T, int>) {
            return s.Int(f.key, out, static_cast<int>(f.min), static_cast<int>(f.max));
          } else if constexpr (std::is_same_v<T, int64_t>) {
            return s.Int(f.key, out, static_cast<int64_t>(f.min), static_cast<int64_t>(f.max));
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            int64_t v = static_cast<int64_t>(out);
            ZR_RETURN_IF_ERROR(
                s.Int(f.key, v, static_cast<int64_t>(f.min), static_cast<int64_t>(f.max)));
            out = static_cast<uint64_t>(v);
            return absl::OkStatus();
          } else if constexpr (std::is_same_v<T, float>) {
            return s.Float(f.key, out, static_cast<float>(f.min), static_cast<float>(f.max));
          } else if constexpr (std::is_same_v<T, double>) {
            return s.Number(f.key, out, f.min, f.max);
          } else if constexpr (std::is_same_v<T, std::string>) {
            return s.String(f.key, out, choices);
          } else if constexpr (std::is_same_v<T, std::vector<int>>) {
            return ReadList(s, f.key, out, f.min, f.max);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            return absl::InternalError(
                StrCat(f.Path(), ": a list of strings needs its own reader"));
          } else {
            static_assert(std::is_same_v<T, std::array<float, 2>>);
            std::vector<double> v = {out[0], out[1]};
            ZR_RETURN_IF_ERROR(s.Numbers(f.key, v, 2, f.min, f.max));
            out = {static_cast<float>(v[0]), static_cast<float>(v[1])};
            return absl::OkStatus();
          }
        }
      },
      f.ref);
}

// Whether FieldsToJson prints this row for `c`.
bool Printed(const ConfigField& f, const RunConfig& c, const nlohmann::json& value) {
  if (f.flags & kNotPrinted) return false;
  if ((f.flags & kOmitUnset) &&
      (value.is_null() || value == 0 || (value.is_string() && value.get<std::string>().empty()))) {
    return false;
  }
  if (const std::string* type = OwnerType(f.section, c)) {
    const auto& shown = f.printed_for.empty() ? f.owners : f.printed_for;
    if (type->empty()) return false;  // no scheduler: no parameters
    if (!shown.empty() && !Contains(shown, *type)) return false;
  }
  return true;
}

}  // namespace

std::string ConfigField::Path() const {
  return section.empty() ? std::string(key) : StrCat(section, ".", key);
}

std::string_view ConfigField::TypeName() const {
  return std::visit(
      [&](auto ref) -> std::string_view {
        using Ref = decltype(ref);
        if constexpr (std::is_same_v<Ref, std::monostate> || std::is_same_v<Ref, EnumRef>) {
          return "string";
        } else {
          using T = std::remove_reference_t<decltype(ref(std::declval<RunConfig&>()))>;
          if constexpr (std::is_same_v<T, bool>) return "boolean";
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return "number";
          if constexpr (std::is_same_v<T, std::string>) return "string";
          if constexpr (std::is_same_v<T, std::vector<int>>) return "list of integers";
          if constexpr (std::is_same_v<T, std::array<float, 2>>) return "two numbers";
          if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list";
          return "integer";
        }
      },
      ref);
}

nlohmann::json ConfigField::Value(const RunConfig& config) const {
  RunConfig& c = const_cast<RunConfig&>(config);  // the ref reads only
  return std::visit(
      [&](auto ref) -> nlohmann::json {
        using Ref = decltype(ref);
        if constexpr (std::is_same_v<Ref, std::monostate>) {
          return nullptr;
        } else if constexpr (std::is_same_v<Ref, EnumRef>) {
          return std::string(choices.at(static_cast<size_t>(ref.get(c))));
        } else {
          const auto& v = ref(c);
          using T = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::vector<int>>) {
            if (v.empty() && (flags & kNullWhenEmpty)) return nullptr;
          }
          return nlohmann::json(v);
        }
      },
      ref);
}

std::span<const ConfigField> ConfigFields() { return Table(); }

const ConfigField* FindConfigField(std::string_view path) {
  for (const ConfigField& f : Table()) {
    if (f.Path() == path) return &f;
  }
  return nullptr;
}

const KeyDirectory& ConfigKeyDirectory() {
  static const KeyDirectory kDirectory = [] {
    KeyDirectory d;
    auto add = [&d](const std::string& section, const std::string& key) {
      std::vector<std::string>& keys = d[section];
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    };
    for (const ConfigField& f : Table()) {
      std::string section(f.section);
      add(section, std::string(f.key));
      while (!section.empty()) {  // each section is a key of its parent
        const size_t dot = section.rfind('.');
        const std::string parent = dot == std::string::npos ? "" : section.substr(0, dot);
        add(parent, section.substr(dot == std::string::npos ? 0 : dot + 1));
        section = parent;
      }
    }
    return d;
  }();
  return kDirectory;
}

void ReadConfigFields(const nlohmann::json& json, RunConfig& c, GivenKeys& given,
                      Problems& problems) {
  const KeyDirectory& directory = ConfigKeyDirectory();
  // Each section opened once, in the table's order; nullopt: absent or not an object.
  std::map<std::string, std::optional<JsonSection>, std::less<>> sections;
  sections.emplace("", JsonSection(json, "", directory));
  sections.at("")->Finish(problems);
  auto open = [&](auto& self, const std::string& path) -> const JsonSection* {
    if (auto it = sections.find(path); it != sections.end()) {
      return it->second ? &*it->second : nullptr;
    }
    const size_t dot = path.rfind('.');
    const JsonSection* parent = self(self, dot == std::string::npos ? "" : path.substr(0, dot));
    std::optional<JsonSection> s;
    if (parent != nullptr) {
      const std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
      StatusOr<std::optional<JsonSection>> child = parent->Object(key);
      if (!child.ok()) {
        problems.Add(child.status());
      } else if (*child) {
        s.emplace(**child);
        s->Finish(problems);
        given.insert(path);
      }
    }
    auto [it, inserted] = sections.emplace(path, std::move(s));
    return it->second ? &*it->second : nullptr;
  };
  for (const ConfigField& f : Table()) {
    const JsonSection* s = open(open, std::string(f.section));
    if (s == nullptr || !s->Has(f.key)) continue;
    given.insert(f.Path());
    problems.Add(ReadField(f, *s, c));
  }
}

void ConfigField::Set(nlohmann::json& config, nlohmann::json value) const {
  nlohmann::json* node = &config;
  std::string_view rest = section;
  while (!rest.empty()) {
    const size_t dot = rest.find('.');
    node = &(*node)[std::string(rest.substr(0, dot))];
    rest = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
  }
  (*node)[std::string(key)] = std::move(value);
}

nlohmann::json FieldsToJson(const RunConfig& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const ConfigField& f : Table()) {
    nlohmann::json value = f.Value(c);
    if (Printed(f, c, value)) f.Set(out, std::move(value));
  }
  return out;
}

}  // namespace zerort
