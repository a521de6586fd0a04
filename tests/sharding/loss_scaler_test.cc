// LossScaler against DeepSpeed's DynamicLossScaler sequence, step by step.
#include "zerort/sharding/loss_scaler.h"

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(LossScalerTest, FollowsDeepSpeedsDynamicScaler) {
  LossScaleOptions o;
  o.initial_scale_power = 4;  // 16
  o.loss_scale_window = 3;
  o.hysteresis = 2;
  o.min_loss_scale = 2;
  LossScaler s(o, true);
  EXPECT_EQ(s.scale(), 16);
  ASSERT_TRUE(s.Update(true).ok());  // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 16);
  ASSERT_TRUE(s.Update(true).ok());  // second: halves
  EXPECT_EQ(s.scale(), 8);
  ASSERT_TRUE(s.Update(false).ok());  // iteration 2, last overflow 1: (2-1) % 3 != 0
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 8);
  ASSERT_TRUE(s.Update(false).ok());  // iteration 4: (4-1) % 3 == 0: doubles
  EXPECT_EQ(s.scale(), 16);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 2) << "never below min_loss_scale";
  EXPECT_EQ(s.skipped_steps(), 8);
}

TEST(LossScalerTest, StopsAfterTooManyConsecutiveSkips) {
  LossScaleOptions o;
  o.max_consecutive_skips = 3;
  LossScaler s(o, true);
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());
  const Status st = s.Update(true);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("3 consecutive steps"), std::string_view::npos) << st;
}

TEST(LossScalerTest, DisabledScalerKeepsOne) {
  LossScaler s(LossScaleOptions{}, false);
  EXPECT_EQ(s.scale(), 1);
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 1);
}

}  // namespace
}  // namespace zerort
