// DeepSpeed's 1-bit LAMB ([Note: 1-bit LAMB], sharding/compressed_allreduce.h) on loopback ranks
// against this file's own implementation of deepspeed/runtime/fp16/onebit/lamb.py, in double:
// the initialisation step, the warm-up's LAMB without bias correction and the frozen trust
// ratio's running average, v_fresh at freeze_step, then the scaling coefficients, the whole
// model's momentum compressed as one padded buffer whose padding keeps the last mean, the
// reconstructed gradient's fresh variance and the clamped factor.
#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "tests/sharding/onebit_reference.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/compressed_allreduce.h"

namespace zerort {
namespace {

using namespace testing;  // the harness: RunConfig, Train, MaxRelativeError, MLP

double Norm(const Vec& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

struct LambReference {
  int world;
  ShardManagerOptions o;
  MlpReference net;
  std::vector<Vec> p, m, v, fresh;
  std::vector<double> coeff, last, scaling;  // per parameter; scaling 0: not set yet
  std::vector<Vec> worker, server;           // [rank], over the fused buffer
  Vec pad;                                   // the fused buffer's padding (alike on every rank)
  int64_t numel = 0, padded = 0, steps = 0;

  explicit LambReference(const RunConfig& c) : world(c.world), o(Options(c)), net(o.seed) {
    for (size_t k = 0; k < net.params.size(); ++k) {
      p.emplace_back(net.params[k].begin(), net.params[k].end());
      m.emplace_back(p[k].size(), 0.0);
      numel += static_cast<int64_t>(p[k].size());
    }
    v = fresh = m;
    coeff.assign(p.size(), 0.0);
    last.assign(p.size(), 1.0);
    scaling.assign(p.size(), 0.0);
    padded = OneBitAllReduce::Padded(numel, world);
    Reset();
  }

  // What a load resets: the errors and the fused buffer (DeepSpeed rebuilds it).
  void Reset() {
    worker.assign(world, Vec(padded, 0.0));
    server.assign(world, Vec(padded / world, 0.0));
    pad.assign(padded - numel, 0.0);
  }

  std::vector<Vec> Gradient(int step, int w) { return RankGradient(net, p, world, step, w); }

  void Step(int step) {
    const OptimizerOptions& opt = o.optimizer;
    std::vector<std::vector<Vec>> g;
    for (int w = 0; w < world; ++w) g.push_back(Gradient(step, w));
    if (++steps == 1) return;  // DeepSpeed's initialisation step
    const bool compressing = steps > std::max<int64_t>(opt.freeze_step, 2);
    double sq = 0;
    std::vector<Vec> mean(p.size());
    for (size_t k = 0; k < p.size(); ++k) {
      mean[k].assign(p[k].size(), 0.0);
      for (int w = 0; w < world; ++w) {
        for (size_t j = 0; j < p[k].size(); ++j) {
          mean[k][j] += g[w][k][j] / world;
          if (compressing) sq += g[w][k][j] * g[w][k][j] / world;
        }
      }
      if (!compressing) sq += Norm(mean[k]) * Norm(mean[k]);
    }
    const double clip =
        o.gradient_clipping > 0 ? std::min(1.0, o.gradient_clipping / (std::sqrt(sq) + 1e-6)) : 1.0;
    auto decay = [&](size_t k) { return net.decay[k] ? double{opt.weight_decay} : 0.0; };
    if (!compressing) {  // LAMB without bias correction
      for (size_t k = 0; k < p.size(); ++k) {
        Vec u(p[k].size());
        for (size_t j = 0; j < p[k].size(); ++j) {
          const double gj = mean[k][j] * clip;
          m[k][j] = m[k][j] * opt.beta1 + (1 - opt.beta1) * gj;
          v[k][j] = v[k][j] * opt.beta2 + (1 - opt.beta2) * gj * gj;
          u[j] = m[k][j] / (std::sqrt(v[k][j]) + opt.eps) + decay(k) * p[k][j];
        }
        if (steps == opt.freeze_step) fresh[k] = v[k];
        const double wn = Norm(p[k]), un = Norm(u);
        double ratio = 1.0;
        if (wn != 0 && un != 0)
          ratio = std::clamp(wn / un, double{opt.min_coeff}, double{opt.max_coeff});
        if (ratio != 1.0) coeff[k] = opt.coeff_beta * coeff[k] + (1 - opt.coeff_beta) * ratio;
        for (size_t j = 0; j < p[k].size(); ++j) p[k][j] -= kLr * ratio * u[j];
      }
      return;
    }
    if (scaling[0] == 0) {  // the first compressed step
      std::vector<double> scale;
      double united = 0;
      for (const Vec& x : m) {
        scale.push_back(Norm(x) / std::sqrt(static_cast<double>(x.size())));
        united += scale.back() / static_cast<double>(m.size());
      }
      for (size_t k = 0; k < m.size(); ++k) scaling[k] = united / scale[k];
    }
    std::vector<Vec> fused(world);
    for (int w = 0; w < world; ++w) {
      for (size_t k = 0; k < p.size(); ++k) {
        for (size_t j = 0; j < p[k].size(); ++j) {
          fused[w].push_back((m[k][j] * opt.beta1 + (1 - opt.beta1) * g[w][k][j] * clip) *
                             scaling[k]);
        }
      }
      fused[w].insert(fused[w].end(), pad.begin(), pad.end());
    }
    const Vec result = world > 1 ? CompressedMeanOf(fused, worker, server) : fused[0];
    pad.assign(result.begin() + numel, result.end());
    size_t at = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      const size_t n = p[k].size();
      Vec u0(n), u(n);
      double factor = 0;
      for (size_t j = 0; j < n; ++j) {
        const double mn = result[at + j] / scaling[k];
        const double r = (mn - m[k][j] * opt.beta1) / (1 - opt.beta1);
        fresh[k][j] = fresh[k][j] * opt.beta2 + (1 - opt.beta2) * r * r;
        m[k][j] = mn;
        const double d = std::sqrt(v[k][j]) + opt.eps;
        u0[j] = mn / d;
        u[j] = u0[j] + decay(k) * p[k][j];
        factor = std::max(factor, d / (std::sqrt(fresh[k][j]) + opt.eps));
      }
      at += n;
      if (decay(k) > 0) {
        const double q = std::min(1.0, Norm(u0) / Norm(u));
        factor = factor * q + (1 - q);
      }
      factor = std::clamp(factor, double{opt.factor_min}, double{opt.factor_max});
      factor = std::min(factor, last[k] * (1 + opt.factor_threshold));
      factor = std::max(factor, last[k] * (1 - opt.factor_threshold));
      last[k] = factor;
      for (size_t j = 0; j < n; ++j) p[k][j] -= kLr * coeff[k] * factor * u[j];
    }
  }
};

std::vector<std::vector<float>> RunReference(const RunConfig& c) {
  return RunReferenceOf<LambReference>(c);
}

RunConfig OneBitLamb(int world, int64_t freeze_step, int steps = 12) {
  return OneBitRun(OptimizerKind::kOneBitLamb, world, freeze_step, steps);
}

void ExpectMatchesReference(const RunConfig& c, const std::string& what) {
  ExpectMatchesReferenceOf<LambReference>(c, what);
}

TEST(OneBitLambTest, MatchesTheReferenceAtWorldSizesOneToFour) {
  for (int world : {1, 2, 3, 4}) {
    ExpectMatchesReference(OneBitLamb(world, 4), StrCat("world ", world));
  }
}

TEST(OneBitLambTest, FreezeStepsAroundTheInitialisationStep) {
  // freeze_step 0-2 compress from step 3; 0 and 1 never copy v into v_fresh (DeepSpeed copies
  // at step == freeze_step, in the warm-up only); past the run nothing compresses.
  for (int64_t freeze : {0, 1, 2, 3, 7, 100}) {
    ExpectMatchesReference(OneBitLamb(2, freeze, 10), StrCat("freeze_step ", freeze));
  }
}

TEST(OneBitLambTest, TheFactorUnclamped) {
  // With DeepSpeed's bounds the factor moves by factor_threshold every step; with wide ones the
  // largest ratio and the weight decay's blend (a decay large enough to weigh) set it.
  for (float threshold : {1.0f, 0.0f}) {
    RunConfig c = OneBitLamb(2, 4, 14);
    c.lamb_factor[0] = 1e6f;
    c.lamb_factor[1] = threshold;
    c.weight_decay = 2.0f;
    ExpectMatchesReference(c, StrCat("factor_threshold ", threshold));
  }
}

TEST(OneBitLambTest, ClippingAndMicroBatches) {
  RunConfig clip = OneBitLamb(3, 3), micro = OneBitLamb(2, 3);
  clip.clip = 0.05f;
  micro.micro_batches = 2;
  ExpectMatchesReference(clip, "clipped");
  ExpectMatchesReference(micro, "two micro-batches");
}

TEST(OneBitLambTest, ALoadZeroesTheErrorsAndTheFusedBuffer) {
  RunConfig c = OneBitLamb(2, 3, 10);
  c.reload_after = 6;  // inside the compressed phase
  ExpectMatchesReference(c, "reloaded after step 6");
  RunConfig straight = c;
  straight.reload_after = 0;
  EXPECT_GT(MaxRelativeError(Train(straight).params, RunReference(c)), 1e-4);
}

TEST(OneBitLambTest, CompressedStepsSendNoGradientCollectives) {
  const RunResult run = Train(OneBitLamb(2, 4, 10));
  ASSERT_EQ(run.error, "");
  EXPECT_EQ(run.gradient_collectives, 4);  // steps 1-4
}

TEST(OneBitLambTest, OtherStagesOffloadAndBadFactorsAreRefused) {
  ExpectOnlyStageZeroOnTheDevice(OptimizerKind::kOneBitLamb);
  // An embedder's options the config would refuse: factor_max below factor_min (0.5), a negative
  // threshold.
  for (auto [factor_max, threshold] : {std::pair{0.25f, 0.1f}, std::pair{4.0f, -1.0f}}) {
    RunConfig c = OneBitLamb(1, 3, 2);
    c.lamb_factor[0] = factor_max;
    c.lamb_factor[1] = threshold;
    EXPECT_NE(Train(c).error.find("1-bit LAMB needs 0 < factor_min <= factor_max"),
              std::string::npos)
        << factor_max << " " << threshold;
  }
}

}  // namespace
}  // namespace zerort
