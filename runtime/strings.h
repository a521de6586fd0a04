// String building for zerort, on fmt (which spdlog already brings). Debian's Abseil has its own
// absl::string_view, distinct from std::string_view, so absl::StrCat rejects std::string_view;
// StrCat here takes anything fmt can format, absl::string_view and absl::Status included.
// Printf-style formatting is fmt::sprintf.
#pragma once

#include <iterator>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"
#include "fmt/printf.h"

#if !defined(ABSL_USES_STD_STRING_VIEW)
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  auto format(absl::string_view v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(v.data(), v.size()), ctx);
  }
};
#endif

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string_view> {
  auto format(const absl::Status& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(s.ToString(), ctx);
  }
};

namespace zerort {

// Concatenates the fmt renderings of `args` ("{}" each).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (fmt::format_to(std::back_inserter(*out), "{}", args), ...);
}

inline std::string_view ToStd(absl::string_view v) { return std::string_view(v.data(), v.size()); }

}  // namespace zerort
