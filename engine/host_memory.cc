// /proc/meminfo and the cgroup v2 limit of this process.
#include "zerort/engine/host_memory.h"

#include <fstream>
#include <sstream>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

std::string Gib(int64_t bytes) { return fmt::format("{:.1f} GiB", bytes / 1073741824.0); }

// A cgroup v2 file of this process's group as a byte count; -1 when absent or "max".
int64_t CgroupValue(const std::string& group, const char* file) {
  std::ifstream in("/sys/fs/cgroup" + group + "/" + file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (...) {
    return -1;
  }
}

}  // namespace

HostMemory QueryHostMemory() {
  HostMemory out;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") {
      out.available = kib * 1024;
      out.source = StrCat("MemAvailable ", Gib(out.available));
    }
  }
  std::ifstream cgroup("/proc/self/cgroup");  // "0::/path" under cgroup v2
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string group = line.substr(3);
    const int64_t limit = CgroupValue(group == "/" ? "" : group, "memory.max");
    if (limit < 0) break;
    const int64_t used =
        std::max<int64_t>(0, CgroupValue(group == "/" ? "" : group, "memory.current"));
    const int64_t left = std::max<int64_t>(0, limit - used);
    StrAppend(&out.source, out.source.empty() ? "" : ", ", "cgroup memory.max ", Gib(limit), " (",
              Gib(used), " used)");
    if (out.available < 0 || left < out.available) out.available = left;
  }
  return out;
}

}  // namespace zerort
