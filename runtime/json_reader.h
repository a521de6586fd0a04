// Strict reading of JSON files. ParseJsonFile is the bounded reader (size, depth, string length)
// and refuses duplicate keys, naming the JSON path; JsonSection reads one object's keys with typed,
// range-checked getters whose errors name the JSON path, the value and what was expected, refuses
// an "auto" left unresolved (config/deepspeed_config.h resolves the ones it can first), and
// Finish() refuses every key the section does not know, with a did-you-mean or the section the key
// belongs to. All errors are InvalidArgument: the CLI maps them to exit code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/runtime/status.h"

namespace zerort {

// The one bounded reader of every JSON zerort reads from a file or the command line (run configs,
// checkpoint metadata, metrics records, --set values): its limits are checked while parsing, so a
// hostile file costs bounded time and memory. Nesting is bounded because nlohmann's parser is
// iterative but copying, comparing, printing and destroying a value recurse once per level (a
// 100,000-deep array is a stack overflow); no zerort file needs more than a handful of levels.
struct JsonLimits {
  size_t max_depth = 64;
  int64_t max_bytes = int64_t{64} << 20;  // the file (ParseJsonFile)
  size_t max_string = size_t{1} << 20;    // bytes of one key or string value
  bool top_level_object = true;           // the value must be an object (configs, metadata)
};

// Parses `text` (read from `file`, named in every message): duplicate keys at any level, nesting
// deeper than max_depth and strings longer than max_string are refused naming the JSON path.
// All errors are InvalidArgument "FILE: ...".
StatusOr<nlohmann::json> ParseJsonText(std::string_view text, std::string_view file,
                                       const JsonLimits& limits = {});
// A regular file (no FIFO or device) of at most max_bytes, parsed as ParseJsonText.
StatusOr<nlohmann::json> ParseJsonFile(const std::string& file, const JsonLimits& limits = {});

// `s` in ASCII lower case (keys and enum values compare case-insensitively).
std::string AsciiLower(std::string_view s);
// A value as JSON text for a message, cut to 60 characters ("..." at the end when cut).
std::string ShortDump(const nlohmann::json& v);

// The closest of `candidates` to `key` (edit distance at most a third of the key's length, at
// least 2), or "" when none is close.
std::string ClosestKey(std::string_view key, const std::vector<std::string>& candidates);

// Every problem of one config, so one run reports them all (a config with five mistakes is
// fixed in one edit, not five runs). ToStatus() joins them under the file's name.
class Problems {
 public:
  void Add(const Status& status);  // an OK status adds nothing
  void Add(std::string message);
  bool empty() const { return messages_.empty(); }
  size_t size() const { return messages_.size(); }
  const std::vector<std::string>& messages() const { return messages_; }
  // InvalidArgument "FILE: MESSAGE" for one problem, "FILE: N problems:\n  - ..." for several.
  Status ToStatus(std::string_view file) const;

 private:
  std::vector<std::string> messages_;
};

// Where every known key lives: section path ("" for the top level) -> its keys. Used to tell a
// user that a key is valid, but in another section.
using KeyDirectory = std::map<std::string, std::vector<std::string>>;

class JsonSection {
 public:
  // `object` must outlive the section. `path` is "" for the top level, else "a.b".
  JsonSection(const nlohmann::json& object, std::string path, const KeyDirectory& directory);

  // Whether the key is present (and not null).
  bool Has(std::string_view key) const;
  // Each getter leaves `out` unchanged when the key is absent.
  Status Int(std::string_view key, int64_t& out, int64_t min, int64_t max) const;
  Status Int(std::string_view key, int& out, int min, int max) const;
  Status Number(std::string_view key, double& out, double min, double max) const;
  Status Float(std::string_view key, float& out, float min, float max) const;
  Status Bool(std::string_view key, bool& out) const;
  // With `allowed` non-empty, the value must be one of them (compared case-insensitively; `out`
  // gets the spelling from `allowed`, and an error quotes the value's start). Without `allowed`,
  // a value longer than kMaxStringValue is refused, its start quoted: no name or path zerort
  // takes is longer, and an error echoing it whole would be as long.
  static constexpr size_t kMaxStringValue = 4096;  // PATH_MAX, the longest path Linux opens
  Status String(std::string_view key, std::string& out,
                const std::vector<std::string>& allowed = {}) const;
  // A JSON array of exactly `n` numbers (any number when `n` is 0) in [min, max].
  Status Numbers(std::string_view key, std::vector<double>& out, size_t n, double min,
                 double max) const;
  // A sub-object; nullopt when absent; an error when present but not an object.
  StatusOr<std::optional<JsonSection>> Object(std::string_view key) const;

  // Refuses keys of this object that are not in the directory's list for this path: the first
  // (Finish) or every one (Finish(problems)).
  Status Finish() const;
  void Finish(Problems& problems) const;

  // "zero_optimization.stage", or "stage" at the top level.
  std::string PathOf(std::string_view key) const;
  // The value of `key` as it is (null: absent or null), for a key's own reader.
  const nlohmann::json* Raw(std::string_view key) const { return Find(key); }
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json* Find(std::string_view key) const;
  Status TypeError(std::string_view key, const nlohmann::json& value, const char* expected) const;

  const nlohmann::json& object_;
  std::string path_;
  const KeyDirectory& directory_;
};

}  // namespace zerort
