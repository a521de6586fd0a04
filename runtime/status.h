// The error taxonomy of zerort: fallible functions return absl::Status / absl::StatusOr<T>,
// propagated with ZR_RETURN_IF_ERROR / ZR_ASSIGN_OR_RETURN; invariants use ZR_CHECK, which stays on
// in release builds. Foreign error codes (errno here; CUDA, NCCL, cuBLAS, MPI beside their
// backends) become a Status whose message names the call that failed.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zerort {

using absl::Status;
using absl::StatusOr;

namespace internal {

// Streams the message of a failed ZR_CHECK, then prints it and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Gives a StatusOr's status or a Status itself, so ZR_RETURN_IF_ERROR accepts both.
inline const Status& GetStatus(const Status& status) { return status; }
template <typename T>
const Status& GetStatus(const StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

// A Status for a failed system call: `call` names it (with its key argument), `err` is errno.
Status ErrnoError(std::string_view call, int err);

// Prefixes a status's message with context ("rank 2/4", "unit blocks.3"), keeping its code.
Status Annotate(const Status& status, std::string_view context);

}  // namespace zerort

#define ZR_INTERNAL_CONCAT2(a, b) a##b
#define ZR_INTERNAL_CONCAT(a, b) ZR_INTERNAL_CONCAT2(a, b)

#define ZR_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                 \
    if (auto&& zr_status_ = (expr); !::zerort::internal::GetStatus(zr_status_).ok()) { \
      return ::zerort::internal::GetStatus(zr_status_);                                \
    }                                                                                  \
  } while (false)

#define ZR_ASSIGN_OR_RETURN(lhs, rexpr) \
  ZR_INTERNAL_ASSIGN_OR_RETURN(ZR_INTERNAL_CONCAT(zr_statusor_, __LINE__), lhs, rexpr)

#define ZR_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

// Always on, also in release builds. Usage: ZR_CHECK(n > 0) << "n=" << n;
#define ZR_CHECK(cond)                 \
  while (__builtin_expect(!(cond), 0)) \
  ::zerort::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define ZR_CHECK_OK(expr)                                                       \
  for (::zerort::Status zr_check_status_ = ::zerort::internal::GetStatus(expr); \
       __builtin_expect(!zr_check_status_.ok(), 0);)                            \
  ::zerort::internal::CheckFailure(__FILE__, __LINE__, #expr " is OK").stream() \
      << zr_check_status_.ToString() << " "
