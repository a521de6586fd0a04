// Memory accounting: tags, peaks (of each category and of the sum), reserved bytes.
#include "zerort/runtime/memory.h"

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(MemoryTrackerTest, CategoryAndTierPeaks) {
  MemoryTracker t;
  t.OnAllocate(MemoryTier::kDevice, MemoryCategory::kParameters, 100);
  t.OnAllocate(MemoryTier::kDevice, MemoryCategory::kActivations, 50);
  t.OnFree(MemoryTier::kDevice, MemoryCategory::kActivations, 50);
  t.OnAllocate(MemoryTier::kDevice, MemoryCategory::kGradients, 30);
  t.OnAllocate(MemoryTier::kHost, MemoryCategory::kOptimizerState, 7);
  EXPECT_EQ(t.Usage(MemoryTier::kDevice, MemoryCategory::kParameters).current, 100);
  EXPECT_EQ(t.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).current, 0);
  EXPECT_EQ(t.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).peak, 50);
  // The tier's peak is the peak of the sum (150), not the sum of the peaks (180).
  EXPECT_EQ(t.InUse(MemoryTier::kDevice).current, 130);
  EXPECT_EQ(t.InUse(MemoryTier::kDevice).peak, 150);
  EXPECT_EQ(t.InUse(MemoryTier::kHost).peak, 7);
  t.ResetPeaks();
  EXPECT_EQ(t.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).peak, 0);
  EXPECT_EQ(t.InUse(MemoryTier::kDevice).peak, 130);
  t.OnReserve(MemoryTier::kDevice, 4096);
  EXPECT_EQ(t.Reserved(MemoryTier::kDevice).current, 4096);
  EXPECT_NE(t.Report().find("parameters"), std::string::npos);
}

TEST(MemoryTrackerDeathTest, NegativeAccountingIsABug) {
  MemoryTracker t;
  EXPECT_DEATH(t.OnFree(MemoryTier::kDevice, MemoryCategory::kWorkspace, 1), "negative");
}

}  // namespace
}  // namespace zerort
