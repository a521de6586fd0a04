// How much host memory this process may use: the kernel's MemAvailable and, when the process is
// in a cgroup (v2) with a limit, that limit minus its current usage; the smaller of the two.
#pragma once

#include <cstdint>
#include <string>

namespace zerort {

struct HostMemory {
  int64_t available = -1;  // bytes; -1 when nothing could be read
  std::string source;      // "MemAvailable 20.1 GiB, cgroup memory.max 8.0 GiB (2.1 GiB used)"
};
HostMemory QueryHostMemory();

}  // namespace zerort
