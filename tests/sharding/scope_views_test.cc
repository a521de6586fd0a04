// The views a scope lends ([Note: view leases]): valid until End(), then every access fails at
// once naming the unit, the scope and the rank (a weight read from last step's view, a gradient
// written after its reduction); and options.poison_released, which fills released weights and
// reduced gradients with NaN so that a raw pointer kept past End() reads NaN, not stale numbers.
#include <cmath>

#include <algorithm>
#include "gtest/gtest.h"
#include "zerort/runtime/loopback_communicator.h"

#include "tests/sharding/harness.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {
namespace {

using namespace testing;  // the harness: Options, MakeMlpRun, MlpForwardBackward

// A manager of the MLP on a group of one (kept alive by the returned struct).
struct OneRank {
  MemoryTracker tracker;
  std::vector<std::unique_ptr<Communicator>> comms = *CreateLoopbackGroup(1, {}, nullptr);
  MlpRun run;
};

std::unique_ptr<OneRank> MakeOneRank(ShardManagerOptions options) {
  auto r = std::make_unique<OneRank>();
  r->run = *MakeMlpRun(options, *r->comms[0], r->tracker);
  return r;
}

TEST(ScopeViewsTest, ViewsWorkUntilEndAndCopiesForQueuedWorkAreUnchecked) {
  auto r = MakeOneRank(Options({.stage = ZeroStage::k3}));
  ShardManager& m = *r->run.manager;
  UnitScope s = *m.BackwardScope(r->run.units[0]);
  const TensorView w = s.param(0), g = s.grad(0);
  EXPECT_TRUE(w.leased() && g.leased());
  EXPECT_TRUE(w.Flat(1, 2).leased());  // views made from a leased view keep the lease
  EXPECT_TRUE(w.Reshape({w.numel()}).leased());
  EXPECT_TRUE(std::isfinite(w.span<float>()[0]));
  g.span<float>()[0] += 1.0f;
  const TensorView queued = g.Detached();  // what a kernel queued on a stream runs on
  EXPECT_FALSE(queued.leased());
  ASSERT_TRUE(s.End().ok());
  // No longer the caller's, and no error: work issued before End() may run after it on such a
  // copy (stream order, not the lease, keeps the memory until it has run).
  EXPECT_NE(queued.data(), nullptr);
}

TEST(ScopeViewsDeathTest, AViewUsedAfterEndFailsNamingUnitScopeAndRank) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  for (const ZeroStage stage : {ZeroStage::k0, ZeroStage::k3}) {
    // A weight from last step's Forward scope (stage 0: the memory is still there and would give
    // plausible numbers; stage 3: it went back to the allocator).
    EXPECT_DEATH(
        {
          auto r = MakeOneRank(Options({.stage = stage}));
          UnitScope s = *r->run.manager->ForwardScope(r->run.units[1]);
          const TensorView w = s.param(0);
          ZR_CHECK_OK(s.End());
          (void)w.span<float>();
        },
        "a view of unit 'fc1' \\(Forward scope, data-parallel rank 0/1\\) \\(f32 \\[[0-9, ]+\\]\\) "
        "was used after its scope's End\\(\\)");
    // A gradient written after its Backward scope ended (and was reduced).
    EXPECT_DEATH(
        {
          auto r = MakeOneRank(Options({.stage = stage}));
          UnitScope s = *r->run.manager->BackwardScope(r->run.units[2]);
          const TensorView g = s.grad(1);
          ZR_CHECK_OK(s.End());
          g.data_as<float>()[0] += 1.0f;
        },
        "a view of unit 'fc2' \\(Backward scope, data-parallel rank 0/1\\)");
    // A part of a stale view, and a scope ended by its destructor.
    EXPECT_DEATH(
        {
          auto r = MakeOneRank(Options({.stage = stage}));
          TensorView w;
          {
            UnitScope s = *r->run.manager->ForwardScope(r->run.units[0]);
            w = s.param(0);
          }
          (void)w.Flat(0, 1);
        },
        "a view of unit 'fc0' \\(Forward scope");
  }
}

// Counts the NaNs in n floats at p.
int64_t NaNs(const float* p, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += std::isnan(p[i]) ? 1 : 0;
  return count;
}

TEST(ScopeViewsTest, PoisonFillsReleasedWeightsAndReducedGradientsWithNaN) {
  for (const bool poison : {false, true}) {
    // Stage 3, nothing persistent: the gathered weights go back to the (caching) allocator at
    // End(); a pointer kept past it reads NaN under poison_released, the old weights without.
    ShardManagerOptions o = Options({.stage = ZeroStage::k3, .persistence_threshold = 0});
    o.poison_released = poison;
    auto r = MakeOneRank(o);
    ShardManager& m = *r->run.manager;
    UnitScope f = *m.ForwardScope(r->run.units[0]);
    const float* w = f.param(0).data_as<float>();
    const int64_t wn = f.param(0).numel();
    ASSERT_EQ(NaNs(w, wn), 0);
    ASSERT_TRUE(f.End().ok());
    EXPECT_EQ(NaNs(w, wn), poison ? wn : 0) << "poison_released " << poison;
    // Its full gradient, dropped once reduced (at the Backward scope's End(), or with the rest
    // of its bucket by ReduceGradients at the latest).
    UnitScope b = *m.BackwardScope(r->run.units[0]);
    float* g = b.grad(0).data_as<float>();
    const int64_t gn = b.grad(0).numel();
    g[0] = 1.0f;
    ASSERT_TRUE(b.End().ok());
    ASSERT_TRUE(m.ReduceGradients().ok());
    EXPECT_EQ(NaNs(g, gn), poison ? gn : 0) << "poison_released " << poison;
  }
}

// [Note: poisoned buffers]: a pointer into a unit's gathered weights, kept and read through while
// the unit is gathered again for its next uses (its backward, then the next steps' forwards and
// backwards, as a trainer that keeps one reads it), reads NaN at the unit's next use, and at two
// of every three uses after (its gathers cycle through three buffers), so a trainer that keeps
// one sees a NaN loss at once; without the option's held buffers the caching allocator hands the
// unit its old buffer back at every use and the stale pointer reads the right weights by luck.
TEST(ScopeViewsTest, AStalePointerReadsNaNWhileItsUnitIsGatheredAgain) {
  for (const bool poison : {false, true}) {
    ShardManagerOptions o = Options({.stage = ZeroStage::k3, .persistence_threshold = 0});
    o.poison_released = poison;
    o.stage3_prefetch_bucket_size = 0;
    auto r = MakeOneRank(o);
    ShardManager& m = *r->run.manager;
    const int unit = r->run.units[0];
    UnitScope first = *m.ForwardScope(unit);
    const float* stale = first.param(0).data_as<float>();
    const int64_t n = first.param(0).numel();
    ASSERT_TRUE(first.End().ok());
    int lucky = 0, uses = 0;   // uses where the stale pointer read the unit's current weights
    int64_t nan_at_next = -1;  // NaNs the stale pointer read during the unit's next use
    for (int step = 0; step < 3; ++step) {
      // Step 0: its backward (the forward was `first`); then a forward and a backward a step.
      const std::vector<bool> uses_this_step =
          step == 0 ? std::vector<bool>{true} : std::vector<bool>{false, true};
      for (const bool backward : uses_this_step) {
        UnitScope s = *(backward ? m.BackwardScope(unit) : m.ForwardScope(unit));
        const float* now = s.param(0).data_as<float>();
        lucky += std::equal(now, now + n, stale) ? 1 : 0;
        if (uses++ == 0) nan_at_next = NaNs(stale, n);
        ASSERT_TRUE(s.End().ok());
      }
      // The step needs every unit's backward; the others' gradients stay zero.
      for (size_t u = 1; u < r->run.units.size(); ++u) {
        ASSERT_TRUE(m.ForwardScope(r->run.units[u])->End().ok());
        ASSERT_TRUE(m.BackwardScope(r->run.units[u])->End().ok());
      }
      ASSERT_TRUE(m.Step({.lr = 0.0f}).ok());
    }
    if (poison) {
      EXPECT_EQ(nan_at_next, n) << "the unit's next use";
      EXPECT_LE(3 * lucky, uses) << "the stale pointer read its unit's weights in " << lucky
                                 << " of " << uses << " later uses";
    } else {
      EXPECT_EQ(lucky, uses) << "without poison the allocator hands the buffer back every time";
    }
  }
}

}  // namespace
}  // namespace zerort
