// stage3_max_reuse_distance's distances, by hand: a forward then a backward over three units.
#include "sharding/reuse_distance.h"

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(ReuseDistanceTest, DistinctOtherUnitsUntilTheNextUse) {
  const std::vector<int> order = {0, 1, 2, 2, 1, 0};
  const std::vector<int64_t> numel = {10, 20, 30};
  EXPECT_EQ(ReuseDistances(order, numel), (std::vector<int64_t>{50, 30, 0, -1, -1, -1}));
  // A unit used twice in between counts once; a persistent unit (0 elements) not at all.
  EXPECT_EQ(ReuseDistances(std::vector<int>{0, 1, 2, 1, 0}, std::vector<int64_t>{10, 20, 0}),
            (std::vector<int64_t>{20, 0, -1, -1, -1}));
}

TEST(ReuseDistanceTest, KeepsBelowTheThresholdOnly) {
  const std::vector<int64_t> d = {50, 30, 0, -1};
  EXPECT_FALSE(KeepsGathered(d, 2, 0)) << "0 never keeps";
  EXPECT_TRUE(KeepsGathered(d, 2, 1));
  EXPECT_FALSE(KeepsGathered(d, 1, 30)) << "strictly below";
  EXPECT_TRUE(KeepsGathered(d, 1, 31));
  EXPECT_FALSE(KeepsGathered(d, 3, 1'000'000'000)) << "not used again";
  EXPECT_FALSE(KeepsGathered(d, 9, 1'000'000'000)) << "past the recorded order";
}

}  // namespace
}  // namespace zerort
