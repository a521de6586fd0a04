// The OpenMP wait setting and zerort's re-execution with it ([Note: OpenMP waits on a busy
// machine], openmp_waits.h).
#include "zerort/kernels/openmp_waits.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "zerort/runtime/strings.h"

namespace zerort {

std::string DescribeOpenMpWaits(const EnvLookup& env) {
  const std::optional<std::string> policy = env("OMP_WAIT_POLICY");
  const std::optional<std::string> spin = env("GOMP_SPINCOUNT");
  if (!policy && !spin) return "libgomp's default (spins about 300,000 times before it sleeps)";
  const bool ours = !policy && env(kZerortWaitsVariable).has_value();
  std::string what;
  if (policy) what = StrCat("OMP_WAIT_POLICY=", *policy);
  if (spin) StrAppend(&what, what.empty() ? "" : ", ", "GOMP_SPINCOUNT=", *spin);
  return StrCat(what, ours ? " (zerort's default)" : " (set by the environment)");
}

std::optional<std::string> ReexecWithOpenMpWaits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return std::nullopt;
  }
  if (setenv("GOMP_SPINCOUNT", kZerortSpinCount, 1) != 0 ||
      setenv(kZerortWaitsVariable, "1", 1) != 0) {
    return StrCat("setenv: ", std::strerror(errno));
  }
  execv("/proc/self/exe", argv);  // returns only on failure
  const int err = errno;
  unsetenv("GOMP_SPINCOUNT");  // this image's libgomp runs with its default: say so truthfully
  unsetenv(kZerortWaitsVariable);
  return StrCat("execv(/proc/self/exe): ", std::strerror(err));
}

}  // namespace zerort
