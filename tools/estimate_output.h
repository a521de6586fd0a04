// zerort estimate's output: the per-category table, the JSON of an estimate, the communication
// line, the --explain terms, and the flags they read (estimate_command.cc runs the model).
#pragma once

#include <string>

#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/estimate/memory_model.h"
#include "zerort/runtime/memory.h"

namespace zerort::cli {

std::string Gib(double bytes);  // "1.25" (GiB)
std::string Mib(double bytes);  // "12.5" (MiB)
// The estimate per tier and category (and the measured step's with its error, when given), the
// reserved peaks and the phases.
void PrintCategories(const MemoryEstimate& e, const MemorySnapshot* measured);
nlohmann::json EstimateJson(const MemoryEstimate& e);
// --intra-gbps and --inter-gbps: 0 (no time) or a speed up to 1e6 Gb/s; NaN is refused too.
Status CheckLinkSpeeds(const EstimateOptions& o);
// [Note: bytes per step] (estimate/comm_model.h) as JSON and as text, with the time at the given
// link speeds.
nlohmann::json CommJson(const StepComm& c, const EstimateOptions& o);
std::string CommText(const StepComm& c, const EstimateOptions& o);
void Explain(const MemoryEstimate& e);  // every term with its formula and size

}  // namespace zerort::cli
