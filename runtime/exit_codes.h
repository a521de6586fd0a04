// Process exit codes of the zerort CLI and of the watchdog (docs/design.md, "Errors and exit
// codes").
#pragma once

namespace zerort {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeFailure = 1;
inline constexpr int kExitUsage = 2;              // bad command line or config
inline constexpr int kExitCollectiveTimeout = 3;  // the watchdog aborted a hung collective
inline constexpr int kExitNonFinite = 4;          // the run stopped on a non-finite loss

}  // namespace zerort
