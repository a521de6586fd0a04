// LAMB kernels: the two passes on a whole parameter against an independent textbook LAMB in
// double (DeepSpeed's FusedLamb: trust ratio from the update before bias correction, clamped),
// over several steps; a parameter split into pieces whose sums are added gives the same step as
// the whole; the coefficient's clamp and its zero-norm rule; and both passes bitwise a scalar
// loop of the shared element math, at whatever vector width the machine's version runs.
#include "zerort/kernels/lamb.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/kernels/random_floats.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/dtype.h"

namespace zerort {
namespace {

TensorView View(std::vector<float>& v) {
  return TensorView(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// Textbook LAMB in double, written from the paper and DeepSpeed's kernel, not from lamb.cc.
void Textbook(const LambHyper& h, std::vector<double>& p, const std::vector<float>& g,
              std::vector<double>& m, std::vector<double>& v) {
  std::vector<double> r(p.size());
  double pn = 0, rn = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = double{g[i]} * h.grad_scale;
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
    r[i] = m[i] / (std::sqrt(v[i]) + h.eps) + h.weight_decay * p[i];
    pn += p[i] * p[i];
    rn += r[i] * r[i];
  }
  double trust = std::sqrt(pn) / std::sqrt(rn);
  trust = std::min<double>(h.max_coeff, std::max<double>(h.min_coeff, trust));
  const double t = static_cast<double>(h.step);
  const double step = h.bias_correction
                          ? h.lr * std::sqrt(1 - std::pow(h.beta2, t)) / (1 - std::pow(h.beta1, t))
                          : h.lr;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= step * trust * r[i];
}

TEST(LambTest, TwoPassesMatchTheTextbook) {
  for (bool bias_correction : {true, false}) {
    const size_t n = 3001;
    std::vector<float> p = testing::RandomNormal<float>(n, 1, 0.05f), m(n, 0), v(n, 0);
    std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
    LambHyper h{.lr = 1e-2f,
                .beta2 = 0.99f,
                .weight_decay = 0.01f,
                .grad_scale = 0.5f,
                .bias_correction = bias_correction};
    for (int step = 1; step <= 5; ++step) {
      h.step = step;
      std::vector<float> g = testing::RandomNormal<float>(n, 10 + step);
      Textbook(h, pd, g, md, vd);
      float sums[2] = {0, 0};
      ASSERT_TRUE(LambMoments(h, View(p), View(g), View(m), View(v),
                              TensorView(sums, DType::kF32, {2}), nullptr)
                      .ok());
      const float coeff = LambCoefficient(h, sums[0], sums[1]);
      EXPECT_GT(coeff, h.min_coeff);  // a real ratio, not a clamp: the test sees the norms
      EXPECT_LT(coeff, h.max_coeff);
      ASSERT_TRUE(LambApply(h, coeff, View(p), View(g), TensorView(), nullptr).ok());
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p[i], pd[i], 2e-5 * (std::abs(pd[i]) + 1e-2)) << i << " bias " << bias_correction;
    }
  }
}

TEST(LambTest, PiecesWithSummedNormsEqualTheWhole) {
  const size_t n = 1000, cut = 377;
  std::vector<float> whole = testing::RandomNormal<float>(n, 3),
                     g = testing::RandomNormal<float>(n, 4);
  std::vector<float> pieces = whole, g2 = g, m1(n, 0), v1(n, 0), m2(n, 0), v2(n, 0);
  const LambHyper h{.lr = 1e-2f, .weight_decay = 0.1f};
  float s1[2] = {0, 0}, s2[2] = {0, 0};
  ASSERT_TRUE(LambMoments(h, View(whole), View(g), View(m1), View(v1),
                          TensorView(s1, DType::kF32, {2}), nullptr)
                  .ok());
  ASSERT_TRUE(
      LambApply(h, LambCoefficient(h, s1[0], s1[1]), View(whole), View(g), TensorView(), nullptr)
          .ok());
  auto part = [&](std::vector<float>& x, size_t a, size_t b) { return View(x).Flat(a, b - a); };
  for (auto [a, b] : {std::pair{size_t{0}, cut}, std::pair{cut, n}}) {
    ASSERT_TRUE(LambMoments(h, part(pieces, a, b), part(g2, a, b), part(m2, a, b), part(v2, a, b),
                            TensorView(s2, DType::kF32, {2}), nullptr)
                    .ok());
  }
  const float coeff = LambCoefficient(h, s2[0], s2[1]);
  EXPECT_NEAR(coeff, LambCoefficient(h, s1[0], s1[1]), 1e-6f * coeff);
  for (auto [a, b] : {std::pair{size_t{0}, cut}, std::pair{cut, n}}) {
    ASSERT_TRUE(
        LambApply(h, coeff, part(pieces, a, b), part(g2, a, b), TensorView(), nullptr).ok());
  }
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(pieces[i], whole[i], 1e-6f * (std::abs(whole[i]) + 1));
}

// The CPU passes are built per vector width (kernels/cpu/lamb.cc); each must give the bits of a
// plain scalar loop over optimizer_math.h's element functions, the norms' sums taken as the
// kernel documents them: fixed chunks of kReduceChunk elements added in order, each chunk's
// element k into double lane k % 8, the lanes added in a tree (lane j += lane j + w for w = 4,
// 2, 1). Two chunks and a tail; every compute-copy type. tools/cpu_levels.py runs it on the
// AVX2 and baseline versions.
TEST(LambTest, BothPassesAreBitwiseAScalarLoop) {
  const int64_t n = 2 * kReduceChunk + 13;
  const size_t un = static_cast<size_t>(n);
  LambHyper h{.lr = 1e-2f, .beta2 = 0.99f, .weight_decay = 0.01f, .step = 3, .grad_scale = 0.5f};
  std::vector<float> p = testing::RandomNormal<float>(un, 21, 0.05f);
  std::vector<float> m = testing::RandomNormal<float>(un, 22, 0.01f);
  std::vector<float> v = testing::RandomNormal<float>(un, 23, 0.01f);
  for (float& x : v) x = std::abs(x);
  const std::vector<float> g0 = testing::RandomNormal<float>(un, 24);

  // The reference: updates and sums.
  std::vector<float> rm = m, rv = v, ru(un);
  const math::LambScalars a = math::MakeLambScalars(h);
  double w = 0, u = 0;
  for (int64_t begin = 0; begin < n; begin += kReduceChunk) {
    double wl[8] = {}, ul[8] = {};
    for (int64_t i = begin; i < std::min(n, begin + kReduceChunk); ++i) {
      const auto k = static_cast<size_t>(i);
      ru[k] = math::LambUpdate(a, p[k], g0[k], rm[k], rv[k]);
      wl[(i - begin) % 8] += static_cast<double>(p[k]) * p[k];
      ul[(i - begin) % 8] += static_cast<double>(ru[k]) * ru[k];
    }
    for (int half = 4; half >= 1; half /= 2) {
      for (int j = 0; j < half; ++j) {
        wl[j] += wl[j + half];
        ul[j] += ul[j + half];
      }
    }
    w += wl[0];
    u += ul[0];
  }

  std::vector<float> g = g0;
  float sums[2] = {0, 0};
  ASSERT_TRUE(LambMoments(h, View(p), View(g), View(m), View(v), TensorView(sums, DType::kF32, {2}),
                          nullptr)
                  .ok());
  EXPECT_EQ(std::memcmp(g.data(), ru.data(), un * 4), 0) << "the updates";
  EXPECT_EQ(std::memcmp(m.data(), rm.data(), un * 4), 0) << "exp_avg";
  EXPECT_EQ(std::memcmp(v.data(), rv.data(), un * 4), 0) << "exp_avg_sq";
  EXPECT_EQ(sums[0], static_cast<float>(w)) << "the parameters' sum of squares";
  EXPECT_EQ(sums[1], static_cast<float>(u)) << "the updates' sum of squares";

  const float coeff = LambCoefficient(h, sums[0], sums[1]);
  for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> q = p, rq = p;
    std::vector<uint16_t> out(2 * un), rout(2 * un);
    const TensorView o(out.data(), out_dtype, {n});
    ASSERT_TRUE(LambApply(h, coeff, View(q), View(g), o, nullptr).ok());
    const TensorView ro(rout.data(), out_dtype, {n});
    // lamb.h: step size lr sqrt(1 - b2^t) / (1 - b1^t), in double, times the trust ratio.
    const double t = static_cast<double>(h.step);
    const float step_coeff =
        static_cast<float>(h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)) /
                           (1.0 - std::pow(static_cast<double>(h.beta1), t)) * coeff);
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      rq[k] = math::LambApplyElement(step_coeff, rq[k], ru[k]);
      StoreFromFloat(ro.data(), out_dtype, i, rq[k]);
    }
    EXPECT_EQ(std::memcmp(q.data(), rq.data(), un * 4), 0) << DTypeName(out_dtype);
    EXPECT_EQ(std::memcmp(out.data(), rout.data(), un * DTypeSize(out_dtype)), 0)
        << "the compute copy, " << DTypeName(out_dtype);
  }
}

TEST(LambTest, CoefficientClampsAndFallsBackToOne) {
  const LambHyper h{.max_coeff = 10.0f, .min_coeff = 0.01f};
  EXPECT_FLOAT_EQ(LambCoefficient(h, 4.0, 1.0), 2.0f);    // ||p|| / ||u|| = 2 / 1
  EXPECT_FLOAT_EQ(LambCoefficient(h, 1e6, 1.0), 10.0f);   // clamped above
  EXPECT_FLOAT_EQ(LambCoefficient(h, 1e-8, 1.0), 0.01f);  // clamped below
  EXPECT_FLOAT_EQ(LambCoefficient(h, 0.0, 1.0), 1.0f);    // a zero parameter
  EXPECT_FLOAT_EQ(LambCoefficient(h, 1.0, 0.0), 1.0f);    // a zero update
}

}  // namespace
}  // namespace zerort
