// Check failures and errno conversion.
#include "zerort/runtime/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "zerort/runtime/strings.h"

namespace zerort {
namespace internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "ZR_CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  const std::string message = stream_.str();
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal

Status ErrnoError(std::string_view call, int err) {
  const std::string message = StrCat(call, " failed: ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(message);
    default:
      return absl::InternalError(message);
  }
}

Status Annotate(const Status& status, std::string_view context) {
  if (status.ok()) return status;
  return Status(status.code(), StrCat(context, ": ", status.message()));
}

}  // namespace zerort
