// [Note: the gather plan] by hand: the record, prefetch within both budgets, reuse-distance keeps
// within the live budget, and what a changed order turns off. ShardManager executes these
// decisions (shard_manager_test.cc checks the gathers it issues) and the memory model replays
// them (the estimator grid test checks the bytes).
#include "sharding/gather_planner.h"

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
