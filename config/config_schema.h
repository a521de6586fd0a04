// The field table of RunConfig: one row per config key (its section, key, member, type, range or
// choices, one-line doc; the default is the member's initializer in config.h, read back through
// the row). The table is the single source of reading (ReadConfigFields), the key directory that
// refuses unknown keys, ToJson / --print-config (FieldsToJson), `zerort config reference` and
// docs/config.md. Rules that relate two keys are not here: config/config_rules.h.
//
// Adding a key: one row in config_rows.cc bound to the member it fills, which the code that uses
// it reads: a member of RunConfig::manager (the ShardManagerOptions the runtime takes) when the key
// sets one of the shard manager's options one to one ([Note: a key is its option], config.h),
// else a member of its section in config.h.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/config/config.h"
#include "zerort/runtime/json_reader.h"

namespace zerort {

// The member a row reads into: a function that returns it from a RunConfig (a captureless lambda;
// the variant's alternative is the key's type).
template <class T>
using FieldRef = T& (*)(RunConfig&);
// An enum member (model.arch: DecoderConfig::arch), read and printed by name: the row's choices
// name the enumerators in value order, taken from the enum's own name function (ZR_ENUM in
// config_rows.h), so the key sets the member the runtime reads, with no string mirror.
struct EnumRef {
  int (*get)(const RunConfig&);
  void (*set)(RunConfig&, int);
};
using AnyFieldRef =
    std::variant<FieldRef<bool>, FieldRef<int>, FieldRef<int64_t>, FieldRef<uint64_t>,
                 FieldRef<float>, FieldRef<double>, FieldRef<std::string>,
                 FieldRef<std::vector<int>>, FieldRef<std::array<float, 2>>,
                 FieldRef<std::vector<std::string>>, EnumRef, std::monostate>;

// Printing (FieldsToJson): every key is printed with its value unless flagged.
enum FieldFlags : unsigned {
  kPrinted = 0,
  kOmitUnset = 1,      // printed only when set (non-zero, non-empty): the batch keys, train.device
  kNotPrinted = 2,     // read, never printed (model.preset: the shape keys say what it set)
  kNullWhenEmpty = 4,  // an empty list prints as null (parallel.pipeline_layers: an even split)
};

// A row's own reader, for the keys whose reading is more than a typed getter (model.preset sets
// other members; optimizer.type and scheduler.type refuse DeepSpeed's types by name).
using CustomRead = Status (*)(const JsonSection& section, std::string_view key, RunConfig& c);

struct ConfigField {
  std::string_view section;  // "zero_optimization.offload_param"; "" for the top level
  std::string_view key;      // "buffer_count"
  AnyFieldRef ref;
  double min = 0, max = 0;                // numbers (lists: each element), inclusive
  std::vector<std::string_view> choices;  // strings: the allowed values (any when empty)
  // optimizer.params and scheduler.params: the types that take this parameter (the rules refuse
  // it under another type, and it is printed only under these); empty: every type.
  std::vector<std::string_view> owners;
  // Printed only under these types when not all owners' (optimizer.params.adam_w_mode: read for
  // AdamW too, where it must be true, printed for Adam only); empty: the owners.
  std::vector<std::string_view> printed_for;
  std::string_view doc;
  unsigned flags = kPrinted;
  CustomRead read = nullptr;

  std::string Path() const;           // "zero_optimization.stage"
  std::string_view TypeName() const;  // "integer", "number", "boolean", "string", "list", ...
  // This row's value in `c` as JSON (the default when `c` is a default RunConfig).
  nlohmann::json Value(const RunConfig& c) const;
  // Writes `value` at this row's path in a config's JSON, creating its sections.
  void Set(nlohmann::json& config, nlohmann::json value) const;
};

std::span<const ConfigField> ConfigFields();
// The row of "a.b.c", or nullptr.
const ConfigField* FindConfigField(std::string_view path);
// Section path -> its keys (sub-sections included), from the table: JsonSection's directory.
const KeyDirectory& ConfigKeyDirectory();

// JSON paths of the keys a config gave (present and not null), for the rules ("total_num_steps is
// required", "momentum is an SGD parameter").
using GivenKeys = std::set<std::string, std::less<>>;

// Reads every row's key present in `json` into `c` (defaults stay where a key is absent), with
// type and range checks; unknown keys, non-object sections and bad values become problems.
void ReadConfigFields(const nlohmann::json& json, RunConfig& c, GivenKeys& given,
                      Problems& problems);

// Every printed row of `c` as one JSON object (RunConfig::ToJson).
nlohmann::json FieldsToJson(const RunConfig& c);

// docs/config.md's reference: one Markdown table per section (key | type | default | allowed |
// what it does); `zerort config reference` prints it and a test compares the file with it.
std::string ConfigReferenceMarkdown();

}  // namespace zerort
