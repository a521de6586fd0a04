// stage3_max_reuse_distance's distances, by hand: a forward then a backward over three units.
#include "zerort/sharding/reuse_distance.h"

#include <chrono>
#include <random>
#include <set>

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

// Against the definition, scanned directly, on random orders (units used any number of times,
// some never gathered).
TEST(ReuseDistanceTest, EqualsTheDirectScanOnRandomOrders) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int units = 1 + static_cast<int>(rng() % 12);
    std::vector<int64_t> numel(static_cast<size_t>(units));
    for (int64_t& x : numel) x = rng() % 4 == 0 ? 0 : static_cast<int64_t>(rng() % 1000);
    std::vector<int> order(rng() % 60);
    for (int& u : order) u = static_cast<int>(rng() % static_cast<unsigned>(units));
    std::vector<int64_t> want(order.size(), -1);
    for (size_t p = 0; p < order.size(); ++p) {
      std::set<int> between;
      for (size_t q = p + 1; q < order.size(); ++q) {
        if (order[q] == order[p]) {
          int64_t d = 0;
          for (int u : between) d += numel[static_cast<size_t>(u)];
          want[p] = d;
          break;
        }
        between.insert(order[q]);
      }
    }
    ASSERT_EQ(ReuseDistances(order, numel), want) << "trial " << trial;
  }
}

// Linear-ish in the order's length: a 100,000-block forward and backward (200,000 uses) in well
// under a second (the direct scan took minutes).
TEST(ReuseDistanceTest, ALongOrderIsQuick) {
  const int units = 100000;
  std::vector<int> order;
  for (int u = 0; u < units; ++u) order.push_back(u);
  for (int u = units - 1; u >= 0; --u) order.push_back(u);
  const std::vector<int64_t> numel(units, 3);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> d = ReuseDistances(order, numel);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(d[0], 3 * (units - 1));
  EXPECT_EQ(d[units - 1], 0);
  EXPECT_LT(s, 2.0);
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
