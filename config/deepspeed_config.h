// DeepSpeed's front end of the config reader: every key DeepSpeed documents has one handling here
// (implemented by the schema, mapped to zerort's key, accepted with a note, or refused by name),
// legacy and alternative names are rewritten to the current ones, and "auto" values are taken out
// to be resolved by Hugging Face's rules once the rest of the config is known. docs/deepspeed.md's
// "DeepSpeed keys" table is this list (a test compares them), so the two cannot drift.
//
// The rule: a key that only tunes or observes how zerort runs is accepted with one note saying
// what zerort does instead; a key that would change the numbers trained is refused (exit 2)
// naming the key, unless its value asks for nothing (`"enabled": false`, DeepSpeed's default).
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/runtime/json_reader.h"

namespace zerort {

struct RunConfig;

enum class DsHandling {
  kImplemented,  // the schema reads it and zerort does what DeepSpeed does
  kMapped,       // another name (legacy, alias): rewritten to `detail`, the key zerort reads
  kAccepted,     // tunes or observes only: accepted, the note says what zerort does instead
  kRefused,      // would change the numbers trained: refused unless its value is `accept_if`
};

struct DsKey {
  std::string_view path;  // "zero_optimization.reduce_scatter"; a section's whole object
  DsHandling handling;
  // Mapped target, what zerort does instead, or why refused; "" for an implemented key whose
  // meaning is its field-table row's doc (config/config_schema.h), the one text.
  std::string_view detail;
  std::string_view example;  // a JSON value with which the key shows its handling (tests, README)
  // kRefused: the JSON values that ask for nothing (accepted quietly), "disabled" for a section
  // with no `"enabled": true` inside; "" for a key refused whatever its value.
  std::string_view accept_if = "";
};

std::span<const DsKey> DeepSpeedKeys();
std::string_view DsHandlingName(DsHandling h);

// docs/deepspeed.md's table: one row per key, `| key | handling | what zerort does |`.
std::string DeepSpeedKeysMarkdown();

// "auto" values taken out of the config, by JSON path, to be resolved after the schema is read.
using AutoKeys = std::vector<std::string>;

// Rewrites `json` in place: legacy forms and alternative names become the current keys,
// accepted keys that the schema does not read are removed, refused keys become problems, and
// "auto" values are removed and listed in `autos` (an "auto" without a rule is a problem).
// `notes` gets one line per accepted, mapped or auto key, for the run's log and --print-config.
void NormalizeDeepSpeed(nlohmann::json& json, Problems& problems, std::vector<std::string>& notes,
                        AutoKeys& autos);

// Writes a value for each listed "auto" into `json` by Hugging Face's rules, reading the values
// the rules need (model.d_model, the optimizer's, train.steps) from `first`, the config as read
// without the autos. Batch keys stay out (ResolveBatch fills them from the data-parallel size);
// when neither train_batch_size nor the micro-batch is left, the micro-batch is Hugging Face's 8.
// One note per value, with where it came from.
void ResolveAutoValues(const AutoKeys& autos, const RunConfig& first, nlohmann::json& json,
                       std::vector<std::string>& notes);

}  // namespace zerort
