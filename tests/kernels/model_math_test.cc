// The GPT operations' shared element arithmetic (kernels/model_math.h) and the CUDA launch
// geometry (kernels/launch_geometry.h), on the CPU: the functions against double-precision
// references, the CPU kernels against the functions bit for bit (so the CUDA kernels, which call
// the same functions, compute what these tests run), and every element, row and column covered
// by the grids the CUDA kernels are launched with.
#include "zerort/kernels/model_math.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/kernels/rope.h"

namespace zerort {
namespace {

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// The largest relative error of f against the double reference over [lo, hi) in steps.
template <typename F, typename R>
double WorstRelativeError(F f, R reference, float lo, float hi, float step) {
  double worst = 0;
  for (float x = lo; x < hi; x += step) {
    const double want = reference(static_cast<double>(x));
    worst = std::max(worst, std::abs(f(x) - want) / want);
  }
  return worst;
}

TEST(ModelMathTest, FastExpIsWithin3e7OfExpAndKeepsNaN) {
  EXPECT_LT(WorstRelativeError(
                math::FastExp, [](double x) { return std::exp(x); }, -87.0f, 88.0f, 0.00097f),
            3e-7);
  EXPECT_TRUE(std::isnan(math::FastExp(NAN)));
  EXPECT_TRUE(std::isnan(math::FastExp(-NAN)));
  EXPECT_EQ(math::FastExp(0.0f), 1.0f);
  // Clamped, never 0 or inf: the softmax's masked scores (-inf - max) give ~1e-38.
  EXPECT_GT(math::FastExp(-INFINITY), 0.0f);
  EXPECT_LT(math::FastExp(-INFINITY), 2e-38f);
  EXPECT_TRUE(std::isfinite(math::FastExp(INFINITY)));
}

// FastExp2 (the CPU flash backward's 2^x) against libm: relative error below 3e-7 over its
// range, exact at the integers it reduces to, clamped to [2^-126, 2^127] outside; NaN.
TEST(ModelMathTest, FastExp2IsWithin3e7OfExp2AndKeepsNaN) {
  EXPECT_LT(WorstRelativeError(
                math::FastExp2, [](double x) { return std::exp2(x); }, -126.0f, 127.0f, 0.00171f),
            3e-7);
  for (float x : {-126.0f, -3.0f, 0.0f, 1.0f, 10.0f, 127.0f}) {
    EXPECT_EQ(math::FastExp2(x), std::exp2(x)) << x;
  }
  EXPECT_EQ(math::FastExp2(-1000.0f), std::exp2(-126.0f));
  EXPECT_EQ(math::FastExp2(1000.0f), std::exp2(127.0f));
  EXPECT_TRUE(std::isnan(math::FastExp2(NAN)));
}

double GeluReference(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

TEST(ModelMathTest, GeluAndItsDerivativeMatchTheTanhFormula) {
  for (float x = -12.0f; x < 12.0f; x += 0.0137f) {
    EXPECT_NEAR(math::Gelu(x), GeluReference(x), 1e-6 * (1 + std::abs(x))) << x;
    const double h = 1e-4;
    const double slope = (GeluReference(x + h) - GeluReference(x - h)) / (2 * h);
    EXPECT_NEAR(math::GeluDerivative(x), slope, 2e-6) << x;
  }
  EXPECT_EQ(math::GeluBackward(1.0f, 0.0f, 2.0f), 2.0f);  // gelu'(0) = 1/2
}

TEST(ModelMathTest, LayerNormPiecesMatchDouble) {
  const std::vector<float> x = testing::RandomNormal<float>(96, 3, 2.0f);
  double sum = 0, sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / x.size();
  for (float v : x) sq += (v - mean) * (v - mean);
  const float inv = math::InverseCount(static_cast<int>(x.size()));
  float fsum = 0;
  for (float v : x) fsum += v;
  const float m = math::Mul(fsum, inv);
  float fsq = 0;
  for (float v : x) fsq += math::SquaredDeviation(v, m);
  const float s = math::LayerNormRstd(fsq, inv, 1e-5f);
  EXPECT_NEAR(s, 1 / std::sqrt(sq / x.size() + 1e-5), 1e-6);
  EXPECT_NEAR(math::LayerNormOut(x[7], m, s, 2.0f, 0.5f),
              (x[7] - mean) / std::sqrt(sq / 96 + 1e-5) * 2 + 0.5, 1e-5);
  // The input gradient of a row whose dnorm means are zero is dy w rstd.
  EXPECT_FLOAT_EQ(math::LayerNormInputGrad(3.0f, 0.5f, x[0], m, s, 0.0f, 0.0f), 1.5f * s);
}

// RMSNorm's pieces against double: rstd, the output, and the input gradient against central
// differences of the row's normalised output (weights w, upstream dy).
TEST(ModelMathTest, RmsNormPiecesMatchDouble) {
  const int n = 96;
  const std::vector<float> x = testing::RandomNormal<float>(n, 5, 2.0f),
                           w = testing::RandomNormal<float>(n, 6),
                           dy = testing::RandomNormal<float>(n, 7);
  const float inv = math::InverseCount(n), eps = 1e-5f;
  auto rms = [&](const std::vector<double>& v, int c) {
    double sq = 0;
    for (double e : v) sq += e * e;
    return v[c] / std::sqrt(sq / n + eps) * w[c];
  };
  float fsq = 0;
  for (float v : x) fsq = math::Add(fsq, math::RmsNormSquare(v));
  const float s = math::RmsNormRstd(fsq, inv, eps);
  const std::vector<double> xd(x.begin(), x.end());
  double sq = 0;
  for (double v : xd) sq += v * v;
  EXPECT_NEAR(s, 1 / std::sqrt(sq / n + eps), 1e-6);
  EXPECT_NEAR(math::RmsNormOut(x[7], s, w[7]), rms(xd, 7), 1e-5);
  float dot = 0;
  for (int c = 0; c < n; ++c) dot = math::Add(dot, math::RmsNormDot(dy[c], w[c], x[c], s));
  dot = math::Mul(dot, inv);
  for (int i : {0, 13, 95}) {
    double want = 0;  // d/dx_i of sum_c dy_c out_c
    const double h = 1e-4;
    for (int c = 0; c < n; ++c) {
      std::vector<double> up = xd, down = xd;
      up[i] += h;
      down[i] -= h;
      want += dy[c] * (rms(up, c) - rms(down, c)) / (2 * h);
    }
    EXPECT_NEAR(math::RmsNormInputGrad(0.5f, dy[i], w[i], x[i], s, dot), 0.5 + want, 1e-4) << i;
  }
  EXPECT_EQ(math::RmsNormWeightGrad(2.0f, 3.0f, 0.25f), 1.5f);
}

// SwiGLU's output and its two gradients against the sigmoid in double, over the gate's range.
TEST(ModelMathTest, SwiGluAndItsGradientsMatchTheSigmoid) {
  for (float g = -30.0f; g < 30.0f; g += 0.0173f) {
    const double sig = 1 / (1 + std::exp(-static_cast<double>(g))), up = 1.5, dy = -0.75;
    EXPECT_NEAR(math::Sigmoid(g), sig, 1e-7) << g;
    EXPECT_NEAR(math::SwiGlu(g, 1.5f), g * sig * up, 1e-6 * (1 + std::abs(g))) << g;
    const float s = math::Sigmoid(g);
    EXPECT_NEAR(math::SwiGluGateGrad(-0.75f, g, 1.5f, s), dy * up * sig * (1 + g * (1 - sig)),
                1e-6 * (1 + std::abs(g)))
        << g;
    EXPECT_NEAR(math::SwiGluUpGrad(-0.75f, g, s), dy * g * sig, 1e-6 * (1 + std::abs(g))) << g;
  }
  EXPECT_EQ(math::SwiGlu(0.0f, 3.0f), 0.0f);
  EXPECT_EQ(math::Sigmoid(0.0f), 0.5f);
  // e^200 is clamped to e^88.4 (FastExp): silu(-200) is -8e-37 instead of -3e-85, still 0 to
  // float's precision beside any other term; a NaN gate stays NaN.
  EXPECT_LE(std::abs(math::SwiGlu(-200.0f, 1.0f)), 1e-36f);
  EXPECT_TRUE(std::isnan(math::SwiGlu(NAN, 1.0f)));
}

// The distance in float steps between a and b of the same sign (0: the same bits).
int64_t FloatSteps(float a, float b) {
  return std::abs(int64_t{std::bit_cast<int32_t>(a)} - int64_t{std::bit_cast<int32_t>(b)});
}

// [Note: the rotary angles]: RopeCosSin's cosine and sine are the float angle's, rounded once
// (against libm's double cos and sin of the same angle, rounded to float): every position of a
// 128k context at four frequencies of a LLaMA 3 head (the highest, 1, turns 131,071 radians,
// 83,443 quadrants), angles about each multiple of pi/2 up to 2^20 quadrants (where cos or sin
// is nearly 0 and the reduction's error shows most), negative angles, and 0 exactly (1, 0).
TEST(ModelMathTest, RopeCosSinIsTheFloatAnglesCosineAndSineRounded) {
  std::vector<float> angles;
  const Rope llama3{.theta = 500000.0};
  for (const float f : {1.0f, RopeFrequency(llama3, 1, 128), RopeFrequency(llama3, 20, 128),
                        RopeFrequency(llama3, 63, 128)}) {
    for (int t = 0; t < 131072; ++t) angles.push_back(math::RopeAngle(t, f));
  }
  for (int64_t k = 1; k < (int64_t{1} << 20); k = k * 5 / 4 + 1) {
    float a = static_cast<float>(k * (3.14159265358979323846 / 2));
    for (int step = 0; step < 8; ++step) a = std::nextafter(a, 0.0f);
    for (int step = 0; step < 16; ++step, a = std::nextafter(a, INFINITY)) {
      angles.push_back(a);
      angles.push_back(-a);
    }
  }
  int64_t rounded_otherwise = 0;
  for (const float a : angles) {
    const math::CosSin got = math::RopeCosSin(a);
    const float want_c = static_cast<float>(std::cos(double{a})),
                want_s = static_cast<float>(std::sin(double{a}));
    for (const auto& [g, w] : {std::pair{got.cos, want_c}, std::pair{got.sin, want_s}}) {
      if (SameBits(g, w)) continue;
      ++rounded_otherwise;
      // Off by one rounding, never more (a value a float step from libm's, of its sign).
      ASSERT_LE(FloatSteps(g, w), 1) << "angle " << a << ": " << g << " against " << w;
    }
  }
  EXPECT_LE(rounded_otherwise, 2) << "of " << 2 * angles.size();
  const math::CosSin zero = math::RopeCosSin(0.0f);
  EXPECT_TRUE(SameBits(zero.cos, 1.0f) && SameBits(zero.sin, 0.0f));
}

// The turn is a rotation (x1 c - x2 s, x2 c + x1 s); turning by -s undoes it to rounding.
TEST(ModelMathTest, RopeTurnRotatesAndTheTransposeTurnsBack) {
  const math::CosSin cs = math::RopeCosSin(0.7f);
  const float x1 = 1.25f, x2 = -0.5f;
  const float y1 = math::RopeTurnFirst(x1, x2, cs.cos, cs.sin),
              y2 = math::RopeTurnSecond(x1, x2, cs.cos, cs.sin);
  EXPECT_NEAR(y1, x1 * std::cos(0.7) - x2 * std::sin(0.7), 1e-6);
  EXPECT_NEAR(y2, x2 * std::cos(0.7) + x1 * std::sin(0.7), 1e-6);
  EXPECT_NEAR(math::RopeTurnFirst(y1, y2, cs.cos, -cs.sin), x1, 1e-6);
  EXPECT_NEAR(math::RopeTurnSecond(y1, y2, cs.cos, -cs.sin), x2, 1e-6);
}

TEST(ModelMathTest, CrossEntropyPieces) {
  // Row (1, 2, 3), target 2: loss log(e^1 + e^2 + e^3) - 3.
  const float max = 3.0f, log_sum = std::log(std::exp(-2.0f) + std::exp(-1.0f) + 1.0f);
  EXPECT_NEAR(math::CrossEntropyLoss(3.0f, max, log_sum),
              std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3, 1e-6);
  float total = 0;
  for (float z : {1.0f, 2.0f, 3.0f}) total += math::CrossEntropyGrad(z, max + log_sum, 1.0f);
  EXPECT_NEAR(total, 1.0f, 1e-6);  // softmax sums to 1; the target then loses `scale`
  EXPECT_EQ(math::CrossEntropyTargetGrad(0.75f, 1.0f), -0.25f);
  EXPECT_NEAR(math::VocabGrad(std::exp(0.0), 4.0, true, 2.0), -1.5, 1e-12);
  EXPECT_EQ(math::VocabLoss(1.0f, 2.0f, 0.5f), 2.5f);
}

// [Note: the cross-entropy's online sum]: a row's logits dealt to `threads` threads W at a time,
// as the CUDA kernel deals them, each thread's running maximum and sum, then the row's maximum
// and the threads' sums against it: the row's log-sum-exp within fp32 summation's rounding of the
// double one, with both of the kernel's exps (FastExp in fp32; the base-2 form of 16-bit logits).
double OnlineLogSumExp(const std::vector<float>& z, int threads, int width, bool base2) {
  const auto exp = [base2](float x, float m, float m2) {
    return base2 ? std::exp2(math::Fma(x, math::kLog2e, -m2)) : math::FastExp(math::Sub(x, m));
  };
  std::vector<math::OnlineLogSum> t(threads);
  for (int th = 0; th < threads; ++th) {
    for (size_t c = size_t{1} * th * width; c < z.size(); c += size_t{1} * threads * width) {
      float vm = z[c];
      for (int e = 1; e < width; ++e) vm = std::fmax(vm, z[c + e]);
      t[th].Raise(vm, exp);
      for (int e = 0; e < width; ++e) t[th].Take(z[c + e], exp);
    }
  }
  float max = -INFINITY;
  for (const math::OnlineLogSum& o : t) max = std::fmax(max, o.max);
  float sum = 0.0f;
  for (const math::OnlineLogSum& o : t) sum += o.SumAgainst(max, math::Base2(max), exp);
  return double{max} + std::log(double{sum});
}

TEST(ModelMathTest, TheCrossEntropysOnlineSumIsTheRowsLogSumExp) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const int vocab : {8, 104, 50304}) {
    std::vector<float> z(vocab);
    for (float& v : z) v = normal(rng);
    // Rising logits make every vector raise its thread's maximum; a spike late in the row too.
    std::vector<float> rising(vocab);
    for (int i = 0; i < vocab; ++i) rising[i] = 0.01f * i;
    for (const std::vector<float>* row : {&z, &rising}) {
      double m = -INFINITY, want = 0;
      for (float v : *row) m = std::max(m, double{v});
      for (float v : *row) want += std::exp(double{v} - m);
      want = m + std::log(want);
      for (const int threads : {1, 7, 1024}) {
        for (const int width : {1, 8}) {
          for (const bool base2 : {false, true}) {
            SCOPED_TRACE(::testing::Message() << vocab << " logits, " << threads << " threads, W "
                                              << width << (base2 ? ", base 2" : ""));
            // A thread's fp32 sum of n terms is within about n ulps (then the threads'): the
            // log-sum-exp within that relative error of the sum.
            const double terms = std::ceil(double{1} * vocab / threads) + threads;
            EXPECT_NEAR(OnlineLogSumExp(*row, threads, width, base2), want,
                        1.2e-7 * terms + 2e-7 * std::abs(want));
          }
        }
      }
    }
  }
  // NaN stays NaN, whether it comes alone in a vector or a thread sees nothing but NaN; a row of
  // -inf but one logit is that logit, whichever threads see only -inf; +inf makes NaN, as the
  // two-pass kernel did.
  std::vector<float> z(64, 1.0f);
  for (const int at : {0, 5, 63}) {
    std::vector<float> nan = z;
    nan[at] = NAN;
    EXPECT_TRUE(std::isnan(OnlineLogSumExp(nan, 8, 8, true))) << at;
    EXPECT_TRUE(std::isnan(OnlineLogSumExp(nan, 64, 1, false))) << at;
  }
  std::vector<float> neg(64, -INFINITY);
  neg[37] = 2.5f;
  for (const bool base2 : {false, true}) {
    EXPECT_NEAR(OnlineLogSumExp(neg, 8, 8, base2), 2.5, 1e-6);
    EXPECT_NEAR(OnlineLogSumExp(neg, 3, 1, base2), 2.5, 1e-6);
  }
  std::vector<float> inf = z;
  inf[9] = INFINITY;
  EXPECT_TRUE(std::isnan(OnlineLogSumExp(inf, 8, 8, true)));
}

// The CPU float kernels compute exactly the shared functions, element by element: what the CUDA
// kernels compute too (model_kernels_cuda_test's SharedElementMathIsBitwiseTheCpus).
TEST(ModelMathTest, CpuKernelsComputeTheSharedFunctionsBitwise) {
  const int rows = 19, ch = 203;  // odd: the vector loops' remainders
  const int64_t n = int64_t{rows} * ch;
  const std::vector<float> x = testing::RandomNormal<float>(n, 5, 3.0f),
                           dout = testing::RandomNormal<float>(n, 6),
                           w = testing::RandomNormal<float>(ch, 7),
                           b = testing::RandomNormal<float>(ch, 8);
  std::vector<float> g(n), dg = testing::RandomNormal<float>(n, 9);
  const std::vector<float> dg0 = dg;
  cpu::fast::GeluForward(g.data(), x.data(), n);
  cpu::fast::GeluBackward(dg.data(), x.data(), dout.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(SameBits(g[i], math::Gelu(x[i]))) << i;
    ASSERT_TRUE(SameBits(dg[i], math::GeluBackward(dg0[i], x[i], dout[i]))) << i;
  }
  std::vector<float> ln(n), mean(rows), rstd(rows);
  cpu::fast::LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                              rows, ch, 1e-5f);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(
        SameBits(ln[i], math::LayerNormOut(x[i], mean[i / ch], rstd[i / ch], w[i % ch], b[i % ch])))
        << i;
  }
  // The rotary embeddings, forward, in place both ways and backward, against the shared angles
  // and turns evaluated here (2 sequences of 37 positions, 3 query heads on 1 key/value head of
  // 10 channels: [Note: the qkv layout]), with LLaMA 3.1's frequencies and with YaRN's (whose
  // cosines and sines are scaled).
  const int batch = 2, seq = 37, heads = 3, kv = 1, hs = 10, half = hs / 2;
  const int row = (heads + 2 * kv) * hs;
  for (const Rope& rope :
       {Rope{.theta = 1000.0, .scaling = {RopeType::kLlama3, 8, 1, 4, 16}},
        Rope{.theta = 1000.0,
        .scaling = {
            .type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 16}}}) {
    const std::vector<float> qkv0 = testing::RandomNormal<float>(int64_t{batch} * seq * row, 10),
                             dqkv = testing::RandomNormal<float>(qkv0.size(), 11);
    auto turned = [&](const std::vector<float>& in, int64_t r, int slot, int i, bool second,
                      float sign) {
      const math::CosSin cs = math::RopeScaled(
          math::RopeCosSin(math::RopeAngle(static_cast<int>(r % seq), RopeFrequency(rope, i, hs))),
          RopeCosSinScale(rope));
      const float x1 = in[r * row + slot * hs + i], x2 = in[r * row + slot * hs + i + half];
      return second ? math::RopeTurnSecond(x1, x2, cs.cos, sign * cs.sin)
                    : math::RopeTurnFirst(x1, x2, cs.cos, sign * cs.sin);
    };
    for (const bool transpose : {false, true}) {
      std::vector<float> qkv = qkv0;
      cpu::RopeQkvInPlace<float>(qkv.data(), batch, seq, heads, kv, hs, rope, transpose);
      for (int64_t r = 0; r < int64_t{batch} * seq; ++r) {
        for (int slot = 0; slot < heads + 2 * kv; ++slot) {
          for (int c = 0; c < hs; ++c) {
            const float want = slot >= heads + kv ? qkv0[r * row + slot * hs + c]  // v: not turned
                                                  : turned(qkv0, r, slot, c % half, c >= half,
                                                           transpose ? -1.0f : 1.0f);
            ASSERT_TRUE(SameBits(qkv[r * row + slot * hs + c], want))
                << "RopeQkvInPlace transpose " << transpose << " row " << r << " slot " << slot
                << " channel " << c;
          }
        }
      }
    }
    const int64_t q_n = int64_t{batch} * seq * heads * hs, kv_n = int64_t{batch} * seq * kv * hs;
    const std::vector<float> dq0 = testing::RandomNormal<float>(q_n, 12),
                             dk0 = testing::RandomNormal<float>(kv_n, 13);
    std::vector<float> dq = dq0, dk = dk0;
    cpu::RopeQkvBackward<float>(dq.data(), dk.data(), nullptr, dqkv.data(), batch, seq, heads, kv,
                                hs, rope);
    for (int64_t r = 0; r < int64_t{batch} * seq; ++r) {
      for (int slot = 0; slot < heads + kv; ++slot) {
        for (int c = 0; c < hs; ++c) {
          const float before = slot < heads ? dq0[(r * heads + slot) * hs + c]
                                            : dk0[(r * kv + slot - heads) * hs + c];
          const float got =
              slot < heads ? dq[(r * heads + slot) * hs + c] : dk[(r * kv + slot - heads) * hs + c];
          const float want = math::Add(before, turned(dqkv, r, slot, c % half, c >= half, -1.0f));
          ASSERT_TRUE(SameBits(got, want))
              << "RopeQkvBackward row " << r << " slot " << slot << " channel " << c;
        }
      }
    }
  }  // each rope
}

TEST(ModelMathTest, IsFiniteAgreesWithStdOnEveryKindOfFloat) {
  std::vector<float> v = testing::RandomFloats(4096, 10);
  testing::AddSpecialFloats(v);
  std::mt19937 rng(11);
  for (int i = 0; i < 100000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (float f : v) ASSERT_EQ(math::IsFinite(f), std::isfinite(f)) << std::bit_cast<uint32_t>(f);
}

TEST(ModelMathTest, EmbeddingRowAndHeadLayoutIndices) {
  EXPECT_EQ(math::EmbeddingRow(5, 0, 10), 5);
  EXPECT_EQ(math::EmbeddingRow(5, 5, 10), 0);
  EXPECT_EQ(math::EmbeddingRow(4, 5, 10), -1);                  // another rank's slice
  EXPECT_EQ(math::EmbeddingRow(15, 5, 10), -1);                 // past this slice
  EXPECT_EQ(math::EmbeddingRow(-1, 0, 10), -1);                 // a corrupt token
  EXPECT_EQ(math::EmbeddingRow(INT32_MAX, -2, INT32_MAX), -1);  // no int overflow
  // [B, NH, T, HS] -> [B, T, parts, NH, HS]: element (b, h, t, d) lands at its token-major place.
  const int batch = 2, heads = 3, seq = 5, hs = 4, parts = 3;
  int64_t i = 0;
  for (int bb = 0; bb < batch; ++bb) {
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < seq; ++t) {
        for (int d = 0; d < hs; ++d, ++i) {
          const int64_t want = ((int64_t{bb} * seq + t) * parts * heads + h) * hs + d;
          ASSERT_EQ(math::TokenMajorIndex(i, seq, heads, hs, parts), want);
        }
      }
    }
  }
}

// Runs a grid-stride loop's index arithmetic for every (block, thread) of the grid.
std::vector<int> GridStrideVisits(int64_t n, int blocks, int threads) {
  std::vector<int> visits(n, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t = 0; t < threads; ++t) {
      for (int64_t i = b * threads + t; i < n; i += int64_t{blocks} * threads) ++visits[i];
    }
  }
  return visits;
}

TEST(LaunchGeometryTest, EveryElementAndRowGetsOneThread) {
  using namespace launch;
  EXPECT_EQ(GridStrideBlocks(0, 4096), 1);  // a grid of 0 is an invalid configuration
  EXPECT_EQ(WarpPerRowBlocks(0), 1);
  for (int64_t n : {1, 255, 256, 257, 4096 * 256 + 1, 3 * 4096 * 256 + 77}) {
    const int blocks = GridStrideBlocks(n, 4096);
    EXPECT_GE(blocks, 1);
    EXPECT_LE(blocks, 4096);
    const std::vector<int> visits = GridStrideVisits(n, blocks, kThreads);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i], 1) << "n " << n << " element " << i;
  }
  // Past int's range: clamped, no overflow.
  EXPECT_EQ(GridStrideBlocks(int64_t{1} << 40, 65535 * 8), 65535 * 8);
  EXPECT_EQ(GridStrideBlocks(int64_t{1} << 40, 1024, 128), 1024);
  for (int64_t rows : {1, 7, 8, 9, 8191, 50257}) {
    const int64_t blocks = WarpPerRowBlocks(rows);
    const int64_t warps = blocks * kThreads / kWarp;
    EXPECT_GE(warps, rows) << rows;
    EXPECT_LT(warps - kThreads / kWarp, rows) << rows;  // no block wholly idle
    EXPECT_LE(blocks, kMaxGridX);
  }
}

// [Note: column sums]: block (tile, chunk) of the partials kernel, warp w, lane l
// takes columns tile 32 width + l width .. + width - 1 and rows chunk rows_per_chunk + w,
// + kWarpsPerBlock, ... of its chunk: every (row, column) exactly once, within the grid's
// limits, the partials within the scratch.
TEST(LaunchGeometryTest, TheColumnSumsVisitEveryRowAndColumnOnce) {
  using namespace launch;
  struct Case {
    int64_t rows, cols;
    int width, sums;
    int64_t max_partials;
  };
  for (const Case& c : {Case{0, 8, 8, 2, 1 << 20}, Case{1, 1, 1, 1, 1 << 20},
                        Case{37, 72, 8, 2, 1 << 20}, Case{129, 100, 1, 2, 1 << 20},
                        Case{1000, 768, 8, 2, 1 << 20}, Case{1000, 768, 8, 2, 2 * 768 * 3},
                        Case{8192, 33, 1, 1, 33}, Case{300, 264, 8, 1, 264 * 2}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " x " << c.cols << " width " << c.width);
    const ColumnSums p = ColumnSumsFor(c.rows, c.cols, c.width, c.sums, c.max_partials);
    EXPECT_GE(p.chunks, 1);
    EXPECT_LE(p.chunks, kMaxGridY);
    EXPECT_LE(p.chunks * c.cols * c.sums, c.max_partials);
    if (c.rows > 0) {
      EXPECT_LT((p.chunks - 1) * p.rows_per_chunk, c.rows) << "an empty chunk";
    }
    if (c.max_partials >= c.cols * c.sums * (c.rows + kRowsPerChunk - 1) / kRowsPerChunk) {
      EXPECT_LE(p.rows_per_chunk, kRowsPerChunk) << "chunks grown with the scratch to spare";
    }
    std::vector<int> visits(static_cast<size_t>(c.rows * c.cols), 0);
    for (int64_t tile = 0; tile < p.tiles; ++tile) {
      for (int64_t chunk = 0; chunk < p.chunks; ++chunk) {
        const int64_t r0 = chunk * p.rows_per_chunk;
        const int64_t r1 = std::min(c.rows, r0 + p.rows_per_chunk);
        for (int t = 0; t < kThreads; ++t) {
          const int64_t col0 = tile * kWarp * c.width + (t % kWarp) * c.width;
          for (int64_t r = r0 + t / kWarp; r < r1; r += kWarpsPerBlock) {
            for (int e = 0; e < c.width && col0 + e < c.cols; ++e) ++visits[r * c.cols + col0 + e];
          }
        }
      }
    }
    for (int v : visits) ASSERT_EQ(v, 1);
  }
}

// NormBackwardKernel's grid: block c takes chunk c's rows a warp a row (warp w: rows w, w + 8,
// ...), then every column tile over the same rows; the finish's block takes kFinishColumns
// columns, warp w the chunks w, w + 8, .... Every row once in the first pass, every (row, column)
// once in the second, every (chunk, column) partial once in the finish, no block idle.
TEST(LaunchGeometryTest, TheNormsOnePassVisitsEveryRowColumnAndPartialOnce) {
  using namespace launch;
  for (const int64_t rows : {1, 31, 32, 33, 1000, 8192}) {
    for (const int64_t cols : {1, 100, 768, 2048}) {
      for (const int width : {1, 8}) {
        if (cols % width != 0) continue;
        SCOPED_TRACE(::testing::Message() << rows << " x " << cols << " width " << width);
        const ColumnSums p = ColumnSumsFor(rows, cols, width, 2, 1 << 22, kFusedRowsPerChunk);
        EXPECT_LE(p.rows_per_chunk, kFusedRowsPerChunk);
        EXPECT_LT((p.chunks - 1) * p.rows_per_chunk, rows) << "an empty chunk";
        EXPECT_LE(p.chunks, kMaxGridX);
        std::vector<int> row_visits(rows, 0), visits(rows * cols, 0);
        for (int64_t chunk = 0; chunk < p.chunks; ++chunk) {
          const int64_t r0 = chunk * p.rows_per_chunk, r1 = std::min(rows, r0 + p.rows_per_chunk);
          for (int warp = 0; warp < kWarpsPerBlock; ++warp) {
            for (int64_t r = r0 + warp; r < r1; r += kWarpsPerBlock) ++row_visits[r];
          }
          for (int64_t tile = 0; tile < p.tiles; ++tile) {
            for (int t = 0; t < kThreads; ++t) {
              const int64_t col0 = tile * kWarp * width + (t % kWarp) * width;
              for (int64_t r = r0 + t / kWarp; r < r1; r += kWarpsPerBlock) {
                for (int e = 0; e < width && col0 + e < cols; ++e) ++visits[r * cols + col0 + e];
              }
            }
          }
        }
        for (int v : row_visits) ASSERT_EQ(v, 1);
        for (int v : visits) ASSERT_EQ(v, 1);
        const int64_t blocks = ColumnFinishBlocks(cols);
        EXPECT_LT((blocks - 1) * kFinishColumns, cols) << "a finish block wholly idle";
        std::vector<int> partials(p.chunks * cols, 0);
        for (int64_t b = 0; b < blocks; ++b) {
          for (int t = 0; t < kThreads; ++t) {
            const int64_t c = b * kFinishColumns + t % kWarp;
            if (c >= cols) continue;
            for (int64_t k = t / kWarp; k < p.chunks; k += kWarpsPerBlock) ++partials[k * cols + c];
          }
        }
        for (int v : partials) ASSERT_EQ(v, 1);
      }
    }
  }
}

}  // namespace
}  // namespace zerort
