// [Note: the gather plan] by hand: the record, prefetch within both budgets, reuse-distance keeps
// within the live budget, and what a changed order turns off. ShardManager executes these
// decisions (shard_manager_test.cc checks the gathers it issues) and the memory model replays
// them (the estimator grid test checks the bytes).
#include "zerort/sharding/gather_planner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "gtest/gtest.h"

namespace zerort {
namespace {

// Units of 10, 20 and 30 elements; unit 3 persistent.
std::vector<GatherPlanner::UnitInfo> Units() {
  return {{10, false}, {20, false}, {30, false}, {5, true}};
}

struct Executor {  // what ShardManager does with the decisions, without buffers
  explicit Executor(GatherPlanner& p) : planner(p) {}
  GatherPlanner& planner;
  std::set<int> resident;
  std::vector<int> prefetched;
  GatherPlanner::Resident Resident() {
    return [this](int u) { return resident.count(u) > 0; };
  }
  void Use(int u) {
    planner.BeginUse(u);
    resident.insert(u);
    for (int p : planner.Prefetch(Resident())) {
      prefetched.push_back(p);
      resident.insert(p);
    }
  }
  bool End(int u) {
    if (u == 3) return false;  // persistent: never released
    if (planner.EndUse(u, Resident())) return true;
    resident.erase(u);
    return false;
  }
  void Step(const std::vector<int>& order) {
    for (int u : order) {
      Use(u);
      End(u);
    }
    for (int u : planner.TakeKept()) resident.erase(u);
    planner.EndStep();
  }
};

const std::vector<int> kOrder = {0, 3, 1, 2, 2, 1, 3, 0};

TEST(GatherPlannerTest, TheFirstStepRecordsWithoutPrefetchOrKeeps) {
  GatherPlanner planner({1000, 1000, 1'000'000}, Units());
  Executor ex(planner);
  for (int u : kOrder) {
    EXPECT_TRUE(planner.BeginUse(u));
    EXPECT_FALSE(planner.replaying());
    EXPECT_TRUE(planner.Prefetch(ex.Resident()).empty());
    EXPECT_FALSE(planner.EndUse(u, ex.Resident()));
  }
  planner.EndStep();
  EXPECT_TRUE(planner.replaying());
}

TEST(GatherPlannerTest, PrefetchStopsAtEitherBudget) {
  // Prefetch budget 50: after unit 0, units 1 and 2 (20 + 30) go ahead.
  GatherPlanner wide({1000, 50, 0}, Units());
  Executor a(wide);
  a.Step(kOrder);
  a.Use(0);
  EXPECT_EQ(a.prefetched, (std::vector<int>{1, 2})) << "persistent unit 3 is skipped";
  // Prefetch budget 49: unit 1 only; it stops at unit 2 rather than skipping it.
  GatherPlanner narrow({1000, 49, 0}, Units());
  Executor b(narrow);
  b.Step(kOrder);
  b.Use(0);
  EXPECT_EQ(b.prefetched, (std::vector<int>{1}));
  // Live budget 40 with unit 0 gathered (10): unit 1 fits (30), unit 2 would make 60.
  GatherPlanner live({40, 1000, 0}, Units());
  Executor c(live);
  c.Step(kOrder);
  c.Use(0);
  EXPECT_EQ(c.prefetched, (std::vector<int>{1}));
  EXPECT_EQ(live.LiveNumel(c.Resident()), 30) << "the persistent unit does not count";
}

// The plan's cost per use does not grow with the model: a forward and backward over 65,536
// units (every other one persistent, prefetch and keeps on) records and replays within 8x of 64
// times the time of 1,024 units (linear; asking every unit at every use, as before, made it 64x:
// a 65,536-block config hung the preflight). The best of three each.
TEST(GatherPlannerTest, PlanningIsLinearInTheUnits) {
  auto seconds = [](int n) {
    double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      std::vector<GatherPlanner::UnitInfo> units;
      for (int u = 0; u < n; ++u) units.push_back({100, u % 2 == 1});
      std::vector<int> order;
      for (int u = 0; u < n; ++u) order.push_back(u);
      for (int u = n - 1; u >= 0; --u) order.push_back(u);
      GatherPlanner planner({1000, 300, 250}, units);
      std::vector<char> resident(static_cast<size_t>(n), 0);
      auto is_resident = [&](int u) { return resident[static_cast<size_t>(u)] != 0; };
      const auto t0 = std::chrono::steady_clock::now();
      for (int step = 0; step < 2; ++step) {
        for (int u : order) {
          planner.BeginUse(u);
          resident[static_cast<size_t>(u)] = 1;
          for (int p : planner.Prefetch(is_resident)) resident[static_cast<size_t>(p)] = 1;
          if (!units[static_cast<size_t>(u)].persistent && !planner.EndUse(u, is_resident)) {
            resident[static_cast<size_t>(u)] = 0;
          }
        }
        for (int u : planner.TakeKept()) resident[static_cast<size_t>(u)] = 0;
        planner.EndStep();
      }
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double small = seconds(1024), large = seconds(65536);
  std::printf("1,024 units %.5f s, 65,536 units %.5f s (%.1fx for 64x the units)\n", small, large,
              large / small);
  EXPECT_LT(large, 8 * 64 * small + 0.05);
}

TEST(GatherPlannerTest, AUnitRecordedTwiceAheadIsGatheredOnce) {
  GatherPlanner planner({1000, 1000, 0}, Units());
  Executor ex(planner);
  ex.Step(kOrder);
  ex.Use(0);
  EXPECT_EQ(ex.prefetched, (std::vector<int>{1, 2}));
}

TEST(GatherPlannerTest, KeepsWithinTheReuseDistanceAndTheLiveBudget) {
  // Unit 2's forward is followed at once by its backward (distance 0): kept with distance 1.
  GatherPlanner planner({1000, 0, 1}, Units());
  Executor ex(planner);
  ex.Step(kOrder);
  ex.Use(0);
  EXPECT_FALSE(ex.End(0)) << "distance 50: released";
  ex.Use(3);
  ex.End(3);
  ex.Use(1);
  EXPECT_FALSE(ex.End(1));
  ex.Use(2);
  EXPECT_TRUE(ex.End(2)) << "distance 0 < 1: kept";
  // Not used again (the step ends here): the step releases it.
  EXPECT_EQ(planner.TakeKept(), (std::vector<int>{2}));
  EXPECT_TRUE(planner.TakeKept().empty());
  // The same with a live budget that cannot also hold the unit used next (unit 2 again, already
  // gathered: 0 more elements) holds; one of 29 elements cannot hold unit 2 (30) itself.
  GatherPlanner tight({29, 0, 1}, Units());
  Executor t(tight);
  t.Step(kOrder);
  for (int u : {0, 3, 1, 2}) t.Use(u), t.End(u);
  EXPECT_TRUE(tight.TakeKept().empty()) << "30 live elements > 29";
}

TEST(GatherPlannerTest, AChangedOrderStopsPrefetchAndKeepsAndRecordsAgain) {
  GatherPlanner planner({1000, 1000, 1'000'000}, Units());
  Executor ex(planner);
  ex.Step(kOrder);
  EXPECT_TRUE(planner.BeginUse(0));
  EXPECT_FALSE(planner.BeginUse(2)) << "the record has 3 here";
  EXPECT_FALSE(planner.replaying());
  EXPECT_TRUE(planner.Prefetch(ex.Resident()).empty());
  EXPECT_TRUE(planner.Upcoming().empty());
  EXPECT_FALSE(planner.EndUse(2, ex.Resident()));
  planner.EndStep();
  EXPECT_FALSE(planner.replaying()) << "the next step records";
  ex.Step({0, 2, 1});
  EXPECT_TRUE(planner.replaying());
  EXPECT_TRUE(planner.BeginUse(0));
  EXPECT_EQ(std::vector<int>(planner.Upcoming().begin(), planner.Upcoming().end()),
            (std::vector<int>{2, 1}));
}

}  // namespace
}  // namespace zerort
