// The field table's row builders and its rows: BuildTable (config_rows.cc), which adds the
// optimizer section's from config_schema_optimizer.cc. Internal to config/; config_schema.cc reads,
// prints and indexes the table.
#pragma once

#include <string_view>
#include <vector>

#include "zerort/config/config_schema.h"

namespace zerort::config_rows {

// One row per kind of value; `doc` last so that a row reads as one line.
inline ConfigField Row(std::string_view section, std::string_view key, AnyFieldRef ref,
                       std::string_view doc) {
  ConfigField f;
  f.section = section;
  f.key = key;
  f.ref = ref;
  f.doc = doc;
  return f;
}
inline ConfigField Bool(std::string_view section, std::string_view key, FieldRef<bool> ref,
                        std::string_view doc) {
  return Row(section, key, ref, doc);
}
template <class T>
ConfigField Num(std::string_view section, std::string_view key, FieldRef<T> ref, double min,
                double max, std::string_view doc) {
  ConfigField f = Row(section, key, ref, doc);
  f.min = min;
  f.max = max;
  return f;
}
inline ConfigField Str(std::string_view section, std::string_view key, FieldRef<std::string> ref,
                       std::vector<std::string_view> choices, std::string_view doc) {
  ConfigField f = Row(section, key, ref, doc);
  f.choices = std::move(choices);
  return f;
}
inline ConfigField Enum(std::string_view section, std::string_view key, EnumRef ref,
                        std::vector<std::string_view> names, std::string_view doc) {
  ConfigField f = Row(section, key, ref, doc);
  f.choices = std::move(names);
  return f;
}
inline ConfigField With(ConfigField f, unsigned flags) {
  f.flags |= flags;
  return f;
}
inline ConfigField Owned(ConfigField f, std::vector<std::string_view> owners,
                         std::vector<std::string_view> printed_for = {}) {
  f.owners = std::move(owners);
  f.printed_for = std::move(printed_for);
  return f;
}
inline ConfigField Custom(std::string_view section, std::string_view key, AnyFieldRef ref,
                          CustomRead read, std::vector<std::string_view> choices,
                          std::string_view doc) {
  ConfigField f = Row(section, key, ref, doc);
  f.choices = std::move(choices);
  f.read = read;
  return f;
}

#define ZR_MEMBER(expr)         \
  +[](RunConfig & c) -> auto& { \
    return c.expr;              \
  }
// An enum member (EnumRef); its row's choices are the enumerators' names in value order, from
// the enum's own name function.
#define ZR_ENUM(expr)                                                           \
  EnumRef {                                                                     \
    +[](const RunConfig& c) { return static_cast<int>(c.expr); },               \
        +[](RunConfig& c, int v) { c.expr = static_cast<decltype(c.expr)>(v); } \
  }

// The optimizer section: its type and every optimizer's parameters, each owned by its types.
void AddOptimizerRows(std::vector<ConfigField>& t);
// Every row of the table, in the order the keys are read, printed and documented.
std::vector<ConfigField> BuildTable();

}  // namespace zerort::config_rows
