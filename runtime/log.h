// Logging through spdlog. The library never writes to stdout: it logs through Logger(), a stderr
// logger named "zerort", which ConfigureLogging replaces with one whose lines carry a
// "[rank r/w]" prefix (and also installs as spdlog's default logger, for applications).
#pragma once

#include <string>

#include "spdlog/spdlog.h"
#include "zerort/runtime/status.h"

namespace zerort {

struct LogOptions {
  int rank = 0;        // this process's rank, for the prefix
  int world_size = 1;  // number of processes, for the prefix
  spdlog::level::level_enum level = spdlog::level::info;
  // When false, ranks other than 0 log only warnings and errors.
  bool all_ranks = true;
};

// Installs a stderr logger carrying the rank prefix as Logger() and as spdlog's default.
void ConfigureLogging(const LogOptions& options);

// The logger of the library: the configured one, or a plain stderr logger before configuration.
std::shared_ptr<spdlog::logger> Logger();

// Parses "trace", "debug", "info", "warn", "error", "off".
StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name);

}  // namespace zerort
