// Status macros and ZR_CHECK.
#include "zerort/runtime/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace zerort {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  ZR_ASSIGN_OR_RETURN(int h, Half(x));
  ZR_ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

Status Propagate(const Status& s) {
  ZR_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusTest, ReturnIfErrorAcceptsStatusAndStatusOr) {
  EXPECT_TRUE(Propagate(absl::OkStatus()).ok());
  EXPECT_EQ(Propagate(absl::NotFoundError("x")).code(), absl::StatusCode::kNotFound);
  auto f = []() -> Status {
    ZR_RETURN_IF_ERROR(Half(3));
    return absl::OkStatus();
  };
  EXPECT_EQ(f().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusTest, ErrnoErrorNamesTheCall) {
  const Status s = ErrnoError("open(\"/nonexistent\")", ENOENT);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("open(\"/nonexistent\") failed"), std::string_view::npos);
  EXPECT_NE(s.message().find("errno 2"), std::string_view::npos);
  EXPECT_EQ(ErrnoError("write", ENOSPC).code(), absl::StatusCode::kResourceExhausted);
}

TEST(StatusTest, AnnotateKeepsCode) {
  const Status s = Annotate(absl::NotFoundError("file"), "rank 2/4");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "rank 2/4: file");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusDeathTest, CheckAbortsWithMessage) {
  const int n = 3;
  EXPECT_DEATH({ ZR_CHECK(n == 4) << "n is " << n; }, "ZR_CHECK failed.*n == 4.*n is 3");
  EXPECT_DEATH({ ZR_CHECK_OK(absl::InternalError("boom")); }, "boom");
}

TEST(StatusTest, CheckPassesSilently) {
  int evaluated = 0;
  ZR_CHECK(++evaluated == 1) << "not reached";
  EXPECT_EQ(evaluated, 1);
}

}  // namespace
}  // namespace zerort
