// The rank-prefixed stderr logger.
#include "zerort/runtime/log.h"

#include "spdlog/sinks/stdout_color_sinks.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

constexpr const char* kLoggerName = "zerort";

}  // namespace

void ConfigureLogging(const LogOptions& options) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(kLoggerName, std::move(sink));
  logger->set_pattern(
      StrCat("[%H:%M:%S.%e] [rank ", options.rank, "/", options.world_size, "] [%^%l%$] %v"));
  auto level = options.level;
  if (!options.all_ranks && options.rank != 0 && level < spdlog::level::warn) {
    level = spdlog::level::warn;
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::drop(kLoggerName);
  spdlog::register_logger(logger);
  spdlog::set_default_logger(logger);
}

std::shared_ptr<spdlog::logger> Logger() {
  if (auto logger = spdlog::get(kLoggerName)) return logger;
  try {
    return spdlog::stderr_color_mt(kLoggerName);
  } catch (const spdlog::spdlog_ex&) {  // another thread registered it first
    return spdlog::get(kLoggerName);
  }
}

StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  const auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") {
    return absl::InvalidArgumentError(
        StrCat("unknown log level '", name, "'; expected trace, debug, info, warn, error or off"));
  }
  return level;
}

}  // namespace zerort
