// The 1-bit optimizers' compressed all-reduce written out in double, for the tests that check
// zerort's against DeepSpeed's algorithms (onebit_adam_test.cc, onebit_lamb_test.cc): scaled
// signs with worker and server error feedback ([Note: 1-bit Adam],
// sharding/compressed_allreduce.h).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/sharding/harness.h"

namespace zerort::testing {

using Vec = std::vector<double>;

// sign as DeepSpeed's compression sees it: +1 for zero.
inline double Sign(double x) { return x < 0 ? -1.0 : 1.0; }

// b -> scale x signs, scale = ||b|| / sqrt(len); b becomes the new error.
inline Vec Compress(Vec& b) {
  double sq = 0;
  for (double x : b) sq += x * x;
  const double s = std::sqrt(sq) / std::sqrt(static_cast<double>(b.size()));
  Vec out(b.size());
  for (size_t j = 0; j < b.size(); ++j) {
    out[j] = s * Sign(b[j]);
    b[j] -= out[j];
  }
  return out;
}

// The compressed mean of the ranks' `values` (each P long, P a multiple of the world size
// times 8): worker[w] (P) and server[w] (P / world) are rank w's errors, updated. Every rank
// rebuilds the same P values.
inline Vec CompressedMeanOf(const std::vector<Vec>& values, std::vector<Vec>& worker,
                            std::vector<Vec>& server) {
  const int world = static_cast<int>(values.size());
  const size_t P = values[0].size(), chunk = P / world;
  std::vector<Vec> signs(world);
  for (int w = 0; w < world; ++w) {
    Vec b(P);
    for (size_t j = 0; j < P; ++j) b[j] = values[w][j] + worker[w][j];
    signs[w] = Compress(b);
    worker[w] = b;
  }
  Vec out(P);
  for (int r = 0; r < world; ++r) {
    Vec c(chunk);
    for (size_t j = 0; j < chunk; ++j) {
      double sum = 0;
      for (int w = 0; w < world; ++w) sum += signs[w][r * chunk + j] / world;
      c[j] = sum + server[r][j];
    }
    const Vec rebuilt = Compress(c);
    server[r] = c;
    for (size_t j = 0; j < chunk; ++j) out[r * chunk + j] = rebuilt[j];
  }
  return out;
}

// Rank w's gradient (the mean over its samples of `step`, of `world` ranks) at parameters `p`,
// through `net` (whose parameters and gradients it overwrites).
inline std::vector<Vec> RankGradient(MlpReference& net, const std::vector<Vec>& p, int world,
                                     int step, int w) {
  for (size_t k = 0; k < p.size(); ++k) {
    for (size_t j = 0; j < p[k].size(); ++j) net.params[k][j] = static_cast<float>(p[k][j]);
    std::fill(net.grads[k].begin(), net.grads[k].end(), 0.0f);
  }
  const int per_rank = kGlobalBatch / world;
  net.Backward(int64_t{step} * kGlobalBatch + w * per_rank, per_rank);
  std::vector<Vec> g;
  for (const auto& x : net.grads) g.emplace_back(x.begin(), x.end());
  return g;
}

// A reference's run of c.steps (Ref(c), Step(step), Reset() after c.reload_after, its `p`).
template <typename Ref>
std::vector<std::vector<float>> RunReferenceOf(const RunConfig& c) {
  Ref ref(c);
  for (int step = 0; step < c.steps; ++step) {
    ref.Step(step);
    if (step + 1 == c.reload_after) ref.Reset();
  }
  std::vector<std::vector<float>> out;
  for (const Vec& x : ref.p) out.emplace_back(x.begin(), x.end());
  return out;
}

// A stage-0 run of a 1-bit optimizer.
inline RunConfig OneBitRun(OptimizerKind kind, int world, int64_t freeze_step, int steps) {
  return {.stage = ZeroStage::k0,
          .world = world,
          .optimizer = kind,
          .steps = steps,
          .freeze_step = freeze_step};
}

// The shard manager's parameters within 2e-5 of Ref's.
template <typename Ref>
void ExpectMatchesReferenceOf(const RunConfig& c, const std::string& what) {
  const RunResult run = Train(c);
  ASSERT_EQ(run.error, "") << what;
  EXPECT_LE(MaxRelativeError(run.params, RunReferenceOf<Ref>(c)), 2e-5) << what;
}

// A 1-bit optimizer at stages 1 and 3, and with its state on the host tier, is refused by
// ShardManager::Create, naming why.
inline void ExpectOnlyStageZeroOnTheDevice(OptimizerKind kind) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k3}) {
    RunConfig c = OneBitRun(kind, 2, 3, 2);
    c.stage = stage;
    EXPECT_NE(Train(c).error.find("need stage 0"), std::string::npos);
  }
  RunConfig host = OneBitRun(kind, 1, 3, 2);
  host.placement.optimizer = MemoryTier::kHost;
  EXPECT_NE(Train(host).error.find("on the device tier"), std::string::npos);
}

}  // namespace zerort::testing
