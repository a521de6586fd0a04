// TensorView's lease ([Note: view leases]): views made from a leased view keep it, a revoked
// lease makes every data access fail naming the view's origin and why it ended, and a Detached
// copy (for work queued on a stream) is never checked.
#include "zerort/runtime/tensor.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(TensorViewTest, LeasesFollowFlatAndReshapeAndDetachedDropsThem) {
  std::vector<float> data(12, 1.0f);
  const TensorView plain(data.data(), DType::kF32, {3, 4});
  EXPECT_FALSE(plain.leased());
  auto lease =
      std::make_shared<ViewLease>(std::make_shared<const std::string>("the test's buffer"));
  const TensorView v = plain.Leased(lease);
  EXPECT_TRUE(v.Flat(4, 4).leased());
  EXPECT_TRUE(v.Reshape({12}).leased());
  const TensorView detached = v.Detached();
  EXPECT_FALSE(detached.leased());
  EXPECT_EQ(v.span<float>().size(), 12u);
  lease->Revoke("the test ended it");
  lease->Revoke("a second revoke changes nothing");
  EXPECT_TRUE(lease->revoked());
  EXPECT_STREQ(lease->why(), "the test ended it");
  EXPECT_EQ(detached.data(), data.data());  // unchecked
  EXPECT_EQ(plain.data(), data.data());     // the lender's own view: unleased
  // Shape and dtype stay readable: only the data is revoked.
  EXPECT_EQ(v.numel(), 12);
}

TEST(TensorViewDeathTest, EveryDataAccessToARevokedViewFailsSayingWhy) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  std::vector<float> data(12, 1.0f);
  auto lease =
      std::make_shared<ViewLease>(std::make_shared<const std::string>("the test's buffer"));
  const TensorView v = TensorView(data.data(), DType::kF32, {3, 4}).Leased(lease);
  lease->Revoke("the test ended it");
  const char* want =
      "a view of the test's buffer \\(f32 \\[3, 4\\]\\) was used after the test ended it";
  EXPECT_DEATH((void)v.data(), want);
  EXPECT_DEATH((void)v.data_as<float>(), want);
  EXPECT_DEATH((void)v.span<float>(), want);
  EXPECT_DEATH((void)v.Flat(0, 1), want);
  EXPECT_DEATH((void)v.Reshape({12}), want);
  EXPECT_DEATH((void)v.Detached(), want);
}

}  // namespace
}  // namespace zerort
