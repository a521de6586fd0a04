// Session::Start without a launcher: a group of one on the CPU, options checked by name, and a
// GPU asked for on a machine without a usable one refused before anything starts.
#include "zerort/runtime/session.h"

#include "gtest/gtest.h"
#include "zerort/runtime/device.h"

namespace zerort {
namespace {

TEST(SessionTest, NoLauncherIsAGroupOfOneOnTheCpu) {
  StatusOr<std::unique_ptr<Session>> s =
      Session::Start(nullptr, nullptr, {.device = "cpu", .configure_logging = false});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->rank(), 0);
  EXPECT_EQ((*s)->size(), 1);
  EXPECT_EQ((*s)->world_source(), "a single process (no launcher)");
  EXPECT_EQ((*s)->device().type, DeviceType::kCpu);
  EXPECT_EQ((*s)->mpi(), nullptr);
  Buffer b = *(*s)->allocator().Allocate(1024, MemoryCategory::kParameters);
  EXPECT_EQ((*s)->allocator().tier(), MemoryTier::kDevice);  // "device": where the run computes
  EXPECT_GE((*s)->tracker().InUse(MemoryTier::kDevice).current, 1024);
}

TEST(SessionTest, BadOptionsAreNamed) {
  StatusOr<std::unique_ptr<Session>> s =
      Session::Start(nullptr, nullptr, {.device = "tpu", .configure_logging = false});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_NE(s.status().message().find("\"tpu\""), std::string_view::npos) << s.status();
  s = Session::Start(nullptr, nullptr, {.collective_timeout_s = 0, .configure_logging = false});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("collective_timeout_s"), std::string_view::npos);
}

TEST(SessionTest, CudaWithoutAUsableGpuIsRefusedSayingWhy) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  StatusOr<std::unique_ptr<Session>> s =
      Session::Start(nullptr, nullptr, {.device = "cuda", .configure_logging = false});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("no usable GPU: "), std::string_view::npos) << s.status();
  EXPECT_FALSE(QueryCuda().unavailable_reason.empty());
}

}  // namespace
}  // namespace zerort
