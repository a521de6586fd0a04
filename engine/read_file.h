// Reading a user's file whole, as untrusted input (configs, token files, text to tokenize).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace zerort {

// A data file, read whole: it must be a regular file (a FIFO, device such as /dev/zero or a
// directory is refused at once, never read) of at most `limit` bytes.
StatusOr<std::string> ReadDataFile(const std::string& path, int64_t limit);

}  // namespace zerort
