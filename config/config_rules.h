// The rules of a run config that relate two or more keys (each key's own type and range are the
// field table's, config/config_schema.h): offload against the ZeRO stage and each other, which
// optimizer and scheduler types own which parameters, the pipeline's layer split, one compute
// precision, and what zerort does not implement in combination (Lamb with tensor parallelism or
// NVMe). They read the config and touch no file: checks of the paths a config names run at
// preflight (engine/preflight.h, CheckRunPaths).
#pragma once

#include "zerort/config/config.h"
#include "zerort/config/config_schema.h"
#include "zerort/runtime/json_reader.h"

namespace zerort {

// Adds each broken rule to `problems`; a key that a rule ignores with a warning (offload_param
// below stage 3) is reset and the warning added to c.warnings.
void CheckConfigRules(RunConfig& c, const GivenKeys& given, Problems& problems);

}  // namespace zerort
