// What this build of zerort contains, and the versions of what it was built against.
#pragma once

#include <string>
#include <vector>

namespace zerort {

struct BuildInfo {
  std::string version;     // zerort's own
  std::string build_type;  // Release, Debug, ...
  std::string compiler;
  bool cuda = false;
  std::string cuda_architectures;
  bool mpi = false;
  bool nccl = false;
  std::string sanitizers;
};

BuildInfo GetBuildInfo();

}  // namespace zerort
