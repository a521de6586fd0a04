// Logging through spdlog. The library never writes to stdout: ConfigureLogging installs a stderr
// logger whose lines carry a "[rank r/w]" prefix. Library code logs with spdlog::info(...) etc.
#pragma once

#include <string>

#include "runtime/status.h"
#include "spdlog/spdlog.h"

namespace zerort {

struct LogOptions {
  int rank = 0;        // this process's rank, for the prefix
  int world_size = 1;  // number of processes, for the prefix
  spdlog::level::level_enum level = spdlog::level::info;
  // When false, ranks other than 0 log only warnings and errors.
  bool all_ranks = true;
};

// Replaces spdlog's default logger with a stderr logger carrying the rank prefix.
void ConfigureLogging(const LogOptions& options);

// Parses "trace", "debug", "info", "warn", "error", "off".
StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name);

}  // namespace zerort
