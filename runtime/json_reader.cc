// Strict JSON config reading: duplicate keys, types, ranges, "auto", unknown keys.
#include "zerort/runtime/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string ShortDump(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* KindOf(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Tracks the keys of every open object while parsing, to refuse duplicates with their path.
struct DuplicateFinder {
  struct Level {
    bool is_object = false;
    std::set<std::string> keys;
    std::string name;  // the key (or [index]) this container sits under
    int64_t index = 0;
  };
  std::vector<Level> stack;
  std::string last_key;
  std::string error;

  std::string Path(const std::string& key) const {
    std::string path;
    for (size_t i = 1; i < stack.size(); ++i) {
      const std::string& n = stack[i].name;
      if (!path.empty() && n[0] != '[') path += ".";
      path += n;
    }
    if (!key.empty()) {
      if (!path.empty()) path += ".";
      path += key;
    }
    return path;
  }
};

}  // namespace

std::string ClosestKey(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(key, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

StatusOr<nlohmann::json> ParseJsonText(std::string_view text, std::string_view file,
                                       const JsonLimits& limits) {
  if (static_cast<int64_t>(text.size()) > limits.max_bytes) {
    return absl::InvalidArgumentError(StrCat(file, ": ", text.size(), " bytes, more than the ",
                                             limits.max_bytes, " this reader takes"));
  }
  DuplicateFinder finder;
  // Limits are checked while parsing (the callback runs before a value is stored): deeper nesting
  // or a longer string stops the parse at once.
  struct OverLimit {};
  using E = nlohmann::json::parse_event_t;
  auto shown_path = [&](const std::string& key) {
    const std::string path = finder.Path(key);
    return path.size() > 200 ? path.substr(0, 197) + "..." : path;
  };
  auto callback = [&](int depth, E event, nlohmann::json& parsed) -> bool {
    (void)depth;
    switch (event) {
      case E::object_start:
      case E::array_start: {
        if (finder.stack.size() >= limits.max_depth) {
          finder.error = StrCat("nested more than ", limits.max_depth, " levels deep at '",
                                shown_path(""), "'");
          throw OverLimit{};
        }
        DuplicateFinder::Level level;
        level.is_object = event == E::object_start;
        if (!finder.stack.empty()) {
          DuplicateFinder::Level& parent = finder.stack.back();
          level.name = parent.is_object ? finder.last_key : StrCat("[", parent.index++, "]");
        }
        finder.stack.push_back(std::move(level));
        break;
      }
      case E::object_end:
      case E::array_end:
        if (!finder.stack.empty()) finder.stack.pop_back();
        break;
      case E::key: {
        std::string key = parsed.get<std::string>();
        if (key.size() > limits.max_string) {
          finder.error = StrCat("a key of ", key.size(), " bytes (at most ", limits.max_string,
                                ") in '", shown_path(""), "'");
          throw OverLimit{};
        }
        if (!finder.stack.back().keys.insert(key).second && finder.error.empty()) {
          finder.error = StrCat("duplicate key '", shown_path(key), "': each key may appear once");
        }
        finder.last_key = std::move(key);
        break;
      }
      case E::value: {
        if (parsed.is_string() && parsed.get_ref<const std::string&>().size() > limits.max_string) {
          const bool in_object = !finder.stack.empty() && finder.stack.back().is_object;
          const std::string at =
              in_object ? shown_path(finder.last_key)
                        : shown_path(StrCat(
                              "[", finder.stack.empty() ? 0 : finder.stack.back().index, "]"));
          finder.error = StrCat("a string of ", parsed.get_ref<const std::string&>().size(),
                                " bytes (at most ", limits.max_string, ") at '", at, "'");
          throw OverLimit{};
        }
        if (!finder.stack.empty() && !finder.stack.back().is_object) ++finder.stack.back().index;
        break;
      }
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {  // parse errors, numbers out of range
    return absl::InvalidArgumentError(StrCat(file, ": not valid JSON: ", e.what()));
  } catch (const OverLimit&) {
    return absl::InvalidArgumentError(StrCat(file, ": ", finder.error));
  }
  if (!finder.error.empty()) return absl::InvalidArgumentError(StrCat(file, ": ", finder.error));
  if (limits.top_level_object && !j.is_object()) {
    return absl::InvalidArgumentError(
        StrCat(file, ": the top level must be a JSON object, not ", KindOf(j)));
  }
  return j;
}

StatusOr<nlohmann::json> ParseJsonFile(const std::string& file, const JsonLimits& limits) {
  // A regular file of at most max_bytes (a FIFO or /dev/zero is refused, not read).
  ZR_ASSIGN_OR_RETURN(const std::string text, ReadDataFile(file, limits.max_bytes));
  return ParseJsonText(text, file, limits);
}

JsonSection::JsonSection(const nlohmann::json& object, std::string path,
                         const KeyDirectory& directory)
    : object_(object), path_(std::move(path)), directory_(directory) {}

std::string JsonSection::PathOf(std::string_view key) const {
  return path_.empty() ? std::string(key) : StrCat(path_, ".", key);
}

const nlohmann::json* JsonSection::Find(std::string_view key) const {
  auto it = object_.find(std::string(key));
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonSection::Has(std::string_view key) const { return Find(key) != nullptr; }

Status JsonSection::TypeError(std::string_view key, const nlohmann::json& value,
                              const char* expected) const {
  if (value.is_string() && AsciiLower(value.get<std::string>()) == "auto") {
    return absl::InvalidArgumentError(
        StrCat(PathOf(key),
               " = \"auto\": zerort resolves \"auto\" only where Hugging Face's "
               "DeepSpeed integration defines a rule (docs/deepspeed.md, \"auto\" values); give ",
               expected));
  }
  return absl::InvalidArgumentError(StrCat(PathOf(key), " = ", ShortDump(value), ": expected ",
                                           expected, ", got ", KindOf(value)));
}

Status JsonSection::Int(std::string_view key, int64_t& out, int64_t min, int64_t max) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  double d = 0;
  if (v->is_number_integer()) {
    d = static_cast<double>(v->get<int64_t>());
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) {
    d = v->get<double>();  // 1e6 is an integer too
  } else {
    return TypeError(key, *v, "an integer");
  }
  if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
    return absl::InvalidArgumentError(StrCat(PathOf(key), " = ", ShortDump(*v),
                                             ": out of range, expected an integer in [", min, ", ",
                                             max, "]"));
  }
  out = static_cast<int64_t>(d);
  return absl::OkStatus();
}

Status JsonSection::Int(std::string_view key, int& out, int min, int max) const {
  int64_t wide = out;
  ZR_RETURN_IF_ERROR(Int(key, wide, min, max));
  out = static_cast<int>(wide);
  return absl::OkStatus();
}

Status JsonSection::Number(std::string_view key, double& out, double min, double max) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return TypeError(key, *v, "a number");
  const double d = v->get<double>();
  if (!(d >= min && d <= max)) {
    return absl::InvalidArgumentError(StrCat(PathOf(key), " = ", ShortDump(*v),
                                             ": out of range, expected a number in [", min, ", ",
                                             max, "]"));
  }
  out = d;
  return absl::OkStatus();
}

Status JsonSection::Float(std::string_view key, float& out, float min, float max) const {
  double d = out;
  ZR_RETURN_IF_ERROR(Number(key, d, min, max));
  out = static_cast<float>(d);
  return absl::OkStatus();
}

Status JsonSection::Bool(std::string_view key, bool& out) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return TypeError(key, *v, "true or false");
  out = v->get<bool>();
  return absl::OkStatus();
}

Status JsonSection::String(std::string_view key, std::string& out,
                           const std::vector<std::string>& allowed) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return TypeError(key, *v, "a string");
  const std::string s = v->get<std::string>();
  if (allowed.empty()) {
    if (s.size() > kMaxStringValue) {
      return absl::InvalidArgumentError(
          StrCat(PathOf(key), " = ", ShortDump(*v), ": ", s.size(),
                 " bytes, longer than any name or path zerort takes (", kMaxStringValue, ")"));
    }
    if (AsciiLower(s) == "auto") return TypeError(key, *v, "a value");
    out = s;
    return absl::OkStatus();
  }
  for (const std::string& a : allowed) {
    if (AsciiLower(a) == AsciiLower(s)) {
      out = a;
      return absl::OkStatus();
    }
  }
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return absl::InvalidArgumentError(
      StrCat(PathOf(key), " = ", ShortDump(*v), ": expected one of ", list));
}

Status JsonSection::Numbers(std::string_view key, std::vector<double>& out, size_t n, double min,
                            double max) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return absl::OkStatus();
  const bool ok = v->is_array() && (n == 0 || v->size() == n) &&
                  std::all_of(v->begin(), v->end(), [](const auto& e) { return e.is_number(); });
  if (!ok) {
    return TypeError(
        key, *v,
        (n == 0 ? std::string("an array of numbers") : StrCat("an array of ", n, " numbers"))
            .c_str());
  }
  std::vector<double> values;
  for (const auto& e : *v) {
    const double d = e.get<double>();
    if (!(d >= min && d <= max)) {
      return absl::InvalidArgumentError(StrCat(PathOf(key), " = ", ShortDump(*v), ": ", d,
                                               " is out of range, expected numbers in [", min, ", ",
                                               max, "]"));
    }
    values.push_back(d);
  }
  out = std::move(values);
  return absl::OkStatus();
}

StatusOr<std::optional<JsonSection>> JsonSection::Object(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::optional<JsonSection>();
  if (!v->is_object()) return TypeError(key, *v, "an object");
  return std::optional<JsonSection>(JsonSection(*v, PathOf(key), directory_));
}

void Problems::Add(const Status& status) {
  if (!status.ok()) messages_.emplace_back(status.message());
}

void Problems::Add(std::string message) { messages_.push_back(std::move(message)); }

Status Problems::ToStatus(std::string_view file) const {
  if (messages_.empty()) return absl::OkStatus();
  if (messages_.size() == 1) return absl::InvalidArgumentError(StrCat(file, ": ", messages_[0]));
  std::string text = StrCat(file, ": ", messages_.size(), " problems:");
  for (const std::string& m : messages_) text += StrCat("\n  - ", m);
  return absl::InvalidArgumentError(text);
}

Status JsonSection::Finish() const {
  Problems problems;
  Finish(problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(problems.messages().front());
}

void JsonSection::Finish(Problems& problems) const {
  const auto own = directory_.find(path_);
  static const std::vector<std::string> kNone;
  const std::vector<std::string>& known = own == directory_.end() ? kNone : own->second;
  for (const auto& [key, value] : object_.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string hint;
    for (const auto& [section, keys] : directory_) {
      if (section != path_ && std::find(keys.begin(), keys.end(), key) != keys.end()) {
        hint = section.empty()
                   ? StrCat("; it belongs at the top level")
                   : StrCat("; it belongs in section '", section, "' (", section, ".", key, ")");
        break;
      }
    }
    if (hint.empty()) {
      const std::string close = ClosestKey(key, known);
      if (!close.empty()) hint = StrCat("; did you mean '", PathOf(close), "'?");
    }
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    problems.Add(StrCat("unknown key '", PathOf(key), "'", hint, " (known keys",
                        path_.empty() ? "" : " of ", path_.empty() ? "" : path_, ": ", list, ")"));
  }
}

}  // namespace zerort
