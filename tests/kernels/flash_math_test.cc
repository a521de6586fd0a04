// [Note: flash attention's tiles] (kernels/flash_math.h) on the CPU: the online softmax over key
// tiles of any size is the softmax (its output and log-sum-exp against double references), the
// backward's recomputed probabilities are the forward's, ScoreGrad is the softmax's gradient
// (finite differences in double), and the causal key counts. The CPU flash kernel runs these
// functions (fast_ops_test.cc compares it with the materialised reference); a CUDA kernel that
// calls them computes what these tests check.
#include "zerort/kernels/flash_math.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zerort {
namespace {

struct Row {
  std::vector<float> dots;            // q . k for each key
  std::vector<std::vector<float>> v;  // each key's value vector
  float scale = 0.25f;
};

Row RandomRow(int keys, int hs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 3.0f);
  Row r;
  for (int j = 0; j < keys; ++j) {
    r.dots.push_back(n(rng));
    r.v.emplace_back();
    for (int c = 0; c < hs; ++c) r.v.back().push_back(n(rng));
  }
  return r;
}

// The forward of one query over tiles of `tile` keys, as the kernels run it.
struct Forward {
  std::vector<float> out;
  float lse = 0;
};
Forward TiledForward(const Row& r, int tile) {
  const int keys = static_cast<int>(r.dots.size()), hs = static_cast<int>(r.v[0].size());
  math::OnlineSoftmax sm;
  std::vector<float> acc(hs, 0.0f);
  for (int k0 = 0; k0 < keys; k0 += tile) {
    const int kn = std::min(tile, keys - k0);
    float tile_max = -INFINITY;
    for (int j = 0; j < kn; ++j) {
      tile_max = std::max(tile_max, math::ScaledScore(r.dots[k0 + j], r.scale));
    }
    const float alpha = sm.Rescale(tile_max);
    for (float& a : acc) a *= alpha;
    float sum = 0.0f;
    for (int j = 0; j < kn; ++j) {
      const float p = sm.Prob(math::ScaledScore(r.dots[k0 + j], r.scale));
      sum += p;
      for (int c = 0; c < hs; ++c) acc[c] += p * r.v[k0 + j][c];
    }
    sm.Accumulate(sum);
  }
  Forward f;
  for (float a : acc) f.out.push_back(a * sm.Inverse());
  f.lse = sm.Lse();
  return f;
}

TEST(FlashMathTest, OnlineSoftmaxOverAnyTilesIsTheSoftmax) {
  const Row r = RandomRow(200, 5, 1);
  double max = -INFINITY;
  for (float x : r.dots) max = std::max(max, double{x} * r.scale);
  double sum = 0;
  std::vector<double> out(5, 0.0);
  for (size_t j = 0; j < r.dots.size(); ++j) {
    const double p = std::exp(double{r.dots[j]} * r.scale - max);
    sum += p;
    for (int c = 0; c < 5; ++c) out[c] += p * r.v[j][c];
  }
  const double lse = max + std::log(sum);
  for (int tile : {1, 7, 64, 200, 256}) {
    const Forward f = TiledForward(r, tile);
    EXPECT_NEAR(f.lse, lse, 1e-6 * std::abs(lse)) << "tile " << tile;
    for (int c = 0; c < 5; ++c) {
      EXPECT_NEAR(f.out[c], out[c] / sum, 2e-6 * (std::abs(out[c] / sum) + 1))
          << "tile " << tile << " channel " << c;
    }
  }
}

// The CPU backward's probability: FastExp2 of the base-2 exponent (the CUDA programs: exp2 of it).
float Recomputed(float dot, float scale, float lse) {
  return math::FastExp2(math::ProbExponent2(dot, math::Base2(scale), math::Base2(lse)));
}

TEST(FlashMathTest, TheBackwardsProbabilitiesAreTheForwards) {
  const Row r = RandomRow(100, 1, 2);
  const Forward f = TiledForward(r, 32);
  math::OnlineSoftmax whole;
  float tile_max = -INFINITY;
  for (float d : r.dots) tile_max = std::max(tile_max, math::ScaledScore(d, r.scale));
  whole.Rescale(tile_max);
  float sum = 0;
  for (float d : r.dots) sum += whole.Prob(math::ScaledScore(d, r.scale));
  whole.Accumulate(sum);
  double total = 0;
  for (float d : r.dots) {
    const float p = Recomputed(d, r.scale, f.lse);
    EXPECT_NEAR(p, whole.Prob(math::ScaledScore(d, r.scale)) * whole.Inverse(), 1e-6);
    total += p;
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

// L = dout . out(x) for a query's raw dot products x; dL/dx_j = p_j (dout . v_j - dout . out)
// scale, which ScoreGrad computes from p, dP and D.
TEST(FlashMathTest, ScoreGradIsTheSoftmaxsGradient) {
  const int hs = 4;
  const Row r = RandomRow(40, hs, 3);
  const std::vector<float> dout = {0.5f, -1.25f, 2.0f, 0.75f};
  auto loss = [&](const std::vector<double>& x) {
    double max = -INFINITY, sum = 0, l = 0;
    for (double d : x) max = std::max(max, d * r.scale);
    for (double d : x) sum += std::exp(d * r.scale - max);
    for (size_t j = 0; j < x.size(); ++j) {
      const double p = std::exp(x[j] * r.scale - max) / sum;
      for (int c = 0; c < hs; ++c) l += dout[c] * p * r.v[j][c];
    }
    return l;
  };
  const Forward f = TiledForward(r, 16);
  float d = 0;
  for (int c = 0; c < hs; ++c) d += dout[c] * f.out[c];
  std::vector<double> x(r.dots.begin(), r.dots.end());
  for (size_t j = 0; j < x.size(); ++j) {
    float dp = 0;
    for (int c = 0; c < hs; ++c) dp += dout[c] * r.v[j][c];
    const float p = Recomputed(r.dots[j], r.scale, f.lse);
    const float analytic = math::ScoreGrad(p, dp, d, r.scale);
    const double h = 1e-4;
    std::vector<double> up = x, down = x;
    up[j] += h;
    down[j] -= h;
    const double numeric = (loss(up) - loss(down)) / (2 * h);
    EXPECT_NEAR(analytic, numeric, 1e-4 * (std::abs(numeric) + 1e-2)) << "key " << j;
  }
}

// The backward's two-operation form: bitwise ScoreGrad at a power-of-two scale (head size 64's
// 1/8), within a few ulps of it at head size 128's 1/sqrt(128).
TEST(FlashMathTest, ScoreGradScaledIsScoreGrad) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> prob(0.0f, 1.0f), value(-4.0f, 4.0f);
  for (const float scale : {0.125f, 1.0f / std::sqrt(128.0f)}) {
    for (int i = 0; i < 10000; ++i) {
      const float p = prob(gen), dp = value(gen), d = value(gen);
      const float want = math::ScoreGrad(p, dp, d, scale);
      const float got = math::ScoreGradScaled(p, dp, math::Mul(d, scale), scale);
      if (scale == 0.125f) {
        ASSERT_EQ(FloatBits(got), FloatBits(want)) << p << " " << dp << " " << d;
      } else {
        ASSERT_NEAR(got, want, 4e-7f * std::abs(p) * (std::abs(dp) + std::abs(d)) * scale + 1e-30f)
            << p << " " << dp << " " << d;
      }
    }
  }
}

TEST(FlashMathTest, CausalKeys) {
  EXPECT_EQ(math::CausalKeys(70, 0, 64), 64);  // an earlier tile: every key
  EXPECT_EQ(math::CausalKeys(70, 64, 64), 7);  // the diagonal tile: keys 64 .. 70
  EXPECT_EQ(math::CausalKeys(64, 64, 64), 1);  // the query's own key only
  EXPECT_EQ(math::CausalKeys(70, 64, 3), 3);   // a short tail tile
  EXPECT_LE(math::CausalKeys(63, 64, 64), 0);  // a tile after the query: skipped
}

// WholeBlock (the blocks the flash programs run unmasked) is exactly "every query of the block
// sees every key of it, within the sequence", over every block of small sizes and offsets.
TEST(FlashMathTest, WholeBlockIsEveryScoreSeen) {
  const int T = 40;
  for (int q0 = 0; q0 < 48; ++q0) {
    for (int k0 = 0; k0 < 48; ++k0) {
      for (int nq : {1, 8, 16}) {
        for (int nk : {1, 8, 16}) {
          bool all = true;
          for (int q = q0; q < q0 + nq; ++q) {
            all = all && q < T && math::CausalKeys(q, k0, nk) == nk && k0 + nk <= T;
          }
          EXPECT_EQ(math::WholeBlock(q0, nq, k0, nk, T), all)
              << "queries " << q0 << "+" << nq << ", keys " << k0 << "+" << nk;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zerort
