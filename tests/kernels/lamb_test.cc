// LAMB kernels: the two passes on a whole parameter against an independent textbook LAMB in
// double (DeepSpeed's FusedLamb: trust ratio from the update before bias correction, clamped),
// over several steps; a parameter split into pieces whose sums are added gives the same step as
// the whole; the coefficient's clamp and its zero-norm rule.
#include "zerort/kernels/lamb.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/random_floats.h"

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
