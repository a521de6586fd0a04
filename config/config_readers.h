// The config keys whose reading is more than a typed getter (internal to config/): each is a
// field-table row's CustomRead (config_rows.cc). model.preset sets the shape's members;
// optimizer.type and scheduler.type refuse DeepSpeed's types zerort does not implement by name;
// data.blend reads Megatron's weighted list of files.
#pragma once

#include <string_view>

#include "zerort/config/config.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/status.h"

namespace zerort::config_readers {

Status ReadPreset(const JsonSection& s, std::string_view key, RunConfig& c);
// model.rope_scaling.rope_type: Hugging Face's names ("default", "linear", "llama3", "yarn"); the
// scaled kinds zerort does not compute (dynamic, longrope) refused by name.
Status ReadRopeType(const JsonSection& s, std::string_view key, RunConfig& c);
Status ReadBlend(const JsonSection& s, std::string_view key, RunConfig& c);
Status ReadOptimizerType(const JsonSection& s, std::string_view key, RunConfig& c);
Status ReadSchedulerType(const JsonSection& s, std::string_view key, RunConfig& c);

}  // namespace zerort::config_readers
