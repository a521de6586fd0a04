// kernels/onebit.h on the CPU: the scaled-sign compression's scale, bits (their order and the
// chunks' placement), error feedback and sign of zero; decoding's sum over sources; the three
// phases of DeepSpeed's 1-bit Adam element math, 0/1 Adam's and 1-bit LAMB's against hand-derived
// values.
#include "zerort/kernels/onebit.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/float_bits.h"

namespace zerort {
namespace {

TensorView F32(std::vector<float>& v) {
  return TensorView(v.data(), DType::kF32, {static_cast<int64_t>(v.size())}, Device::Cpu());
}

TEST(OneBitKernelTest, SignCompressScalesPacksAndKeepsTheError) {
  // 16 values in two chunks of 8, the second chunk's byte 5 bytes after the first's.
  std::vector<float> b = {3, -1, 0, -0.0f, 2, -2, 1, -1, 4, 4, 4, 4, -4, -4, -4, -4};
  float sum_sq = 0;
  for (float x : b) sum_sq += x * x;  // 9+1+0+0+4+4+1+1 + 8x16 = 148
  float scale = 0;
  std::vector<uint8_t> bits(7, 0xAA);
  const std::vector<float> before = b;
  ASSERT_TRUE(SignCompress(F32(b), &sum_sq, &scale, bits.data(), 8, 5, nullptr).ok());
  EXPECT_FLOAT_EQ(scale, std::sqrt(148.0f) / 4.0f);
  // Bit 7 first: + - + + + - + -  (0 and -0 count as +), then + + + + - - - -.
  EXPECT_EQ(bits[0], 0b10111010);
  EXPECT_EQ(bits[5], 0b11110000);
  EXPECT_EQ(bits[1], 0xAA) << "bytes between the chunks untouched";
  for (size_t j = 0; j < b.size(); ++j) {
    const float sign = before[j] < 0 ? -1.0f : 1.0f;
    EXPECT_EQ(b[j], before[j] - sign * scale) << j;
  }
  std::vector<float> odd(12, 1.0f);
  EXPECT_FALSE(SignCompress(F32(odd), &sum_sq, &scale, bits.data(), 8, 1, nullptr).ok());
  std::vector<float> sixteen(16, 1.0f);
  EXPECT_FALSE(SignCompress(F32(sixteen), &sum_sq, &scale, bits.data(), 12, 2, nullptr).ok());
}

TEST(OneBitKernelTest, SignDecodeSumsScaledSignsOverSources) {
  // Two sources, 8 elements each, 3 bytes apart; scales 2 and 6 two floats apart; factor 1/2.
  const uint8_t bits[] = {0b11110000, 0, 0, 0b10101010};
  const float scales[] = {2.0f, -99.0f, 6.0f};
  std::vector<float> out(8, 10.0f);
  ASSERT_TRUE(SignDecode(bits, 3, scales, 2, 2, 0.5f, true, F32(out), nullptr).ok());
  const float want[] = {1 + 3 + 10,  1 - 3 + 10,  1 + 3 + 10,  1 - 3 + 10,
                        -1 + 3 + 10, -1 - 3 + 10, -1 + 3 + 10, -1 - 3 + 10};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(out[j], want[j]) << j;
  std::vector<float> five(5, 7.0f);  // one source, no accumulation, a partial byte
  ASSERT_TRUE(SignDecode(bits + 3, 0, scales, 0, 1, 1.0f, false, F32(five), nullptr).ok());
  EXPECT_EQ(five, (std::vector<float>{2, -2, 2, -2, 2}));
}

TEST(OneBitKernelTest, AdamPhasesFollowDeepSpeed) {
  const OneBitAdamHyper h{.lr = 0.5f,
                          .beta1 = 0.5f,
                          .beta2 = 0.75f,
                          .eps = 0.0f,
                          .weight_decay = 0.25f,
                          .grad_scale = 2.0f};
  std::vector<float> p = {1.0f}, g = {1.0f}, m = {1.0f}, v = {3.0f};
  std::vector<uint16_t> out(1);
  const TensorView bf16(out.data(), DType::kBF16, {1}, Device::Cpu());
  // Warm-up: g' = 2; m = 0.5 + 0.5 x 2 = 1.5; v = 2.25 + 0.25 x 4 = 3.25;
  // p = 1 - 0.5 (1.5 / sqrt(3.25) + 0.25).
  ASSERT_TRUE(
      OneBitAdamStep(h, OneBitPhase::kWarmup, F32(p), F32(g), F32(m), F32(v), bf16, nullptr).ok());
  EXPECT_EQ(m[0], 1.5f);
  EXPECT_EQ(v[0], 3.25f);
  const float want = 1.0f - 0.5f * (1.5f / std::sqrt(3.25f) + 0.25f);
  EXPECT_FLOAT_EQ(p[0], want);
  EXPECT_EQ(LoadAsFloat(out.data(), DType::kBF16, 0), Bf16BitsToFloat(FloatToBf16Bits(p[0])));
  // Momentum: m only (v frozen, p untouched): m = 0.75 + 0.5 x 2 = 1.75.
  const float p_before = p[0];
  ASSERT_TRUE(OneBitAdamStep(h, OneBitPhase::kMomentum, F32(p), F32(g), F32(m), F32(v),
                             TensorView(), nullptr)
                  .ok());
  EXPECT_EQ(m[0], 1.75f);
  EXPECT_EQ(v[0], 3.25f);
  EXPECT_EQ(p[0], p_before);
  // Apply: p from m and v, no gradient read.
  ASSERT_TRUE(OneBitAdamStep(h, OneBitPhase::kApply, F32(p), TensorView(), F32(m), F32(v),
                             TensorView(), nullptr)
                  .ok());
  EXPECT_FLOAT_EQ(p[0], p_before - 0.5f * (1.75f / std::sqrt(3.25f) + 0.25f * p_before));
  EXPECT_FALSE(OneBitAdamStep(h, OneBitPhase::kWarmup, F32(p), TensorView(), F32(m), F32(v),
                              TensorView(), nullptr)
                   .ok());
}

TEST(OneBitKernelTest, ZeroOnePhasesFollowDeepSpeed) {
  const OneBitAdamHyper h{.lr = 0.5f, .eps = 0.0f, .weight_decay = 0.0f};
  std::vector<float> p = {1.0f}, m = {2.0f}, v = {4.0f}, acc = {0.25f};
  // Local step: t = -0.5 x 2 / 2 = -0.5; p 0.5, acc -0.25.
  ASSERT_TRUE(ZeroOneAdamStep(h, 0, ZeroOnePhase::kLocalStep, F32(p), F32(m), F32(v), F32(acc),
                              TensorView(), nullptr)
                  .ok());
  EXPECT_EQ(p[0], 0.5f);
  EXPECT_EQ(acc[0], -0.25f);
  // Sync out: p -= acc (0.75); acc x= sqrt(v) (-0.5).
  ASSERT_TRUE(ZeroOneAdamStep(h, 0, ZeroOnePhase::kSyncOut, F32(p), F32(m), F32(v), F32(acc),
                              TensorView(), nullptr)
                  .ok());
  EXPECT_EQ(p[0], 0.75f);
  EXPECT_EQ(acc[0], -0.5f);
  // Sync in with lrs 0.25: m = 2; p += -0.5 / 2 (0.5); acc 0. No local steps: refused.
  ASSERT_TRUE(ZeroOneAdamStep(h, 0.25f, ZeroOnePhase::kSyncIn, F32(p), F32(m), F32(v), F32(acc),
                              TensorView(), nullptr)
                  .ok());
  EXPECT_EQ(m[0], 2.0f);
  EXPECT_EQ(p[0], 0.5f);
  EXPECT_EQ(acc[0], 0.0f);
  EXPECT_FALSE(ZeroOneAdamStep(h, 0, ZeroOnePhase::kSyncIn, F32(p), F32(m), F32(v), F32(acc),
                               TensorView(), nullptr)
                   .ok());
}

TEST(OneBitKernelTest, LambMomentumAndReconstructionFollowDeepSpeed) {
  // beta1 0.5, beta2 0.75, eps 0: fused = (0.5 m + 0.5 g) x scaling.
  const OneBitAdamHyper h{.beta1 = 0.5f, .beta2 = 0.75f, .eps = 0.0f, .grad_scale = 2.0f};
  std::vector<float> g = {1.0f, -2.0f}, m = {2.0f, 4.0f}, fused(2);
  ASSERT_TRUE(OneBitLambMomentum(h, 4.0f, F32(g), F32(m), F32(fused), nullptr).ok());
  EXPECT_EQ(fused, (std::vector<float>{8.0f, 0.0f}));  // (1 + 2 x 0.5) x 4, (2 - 4 x 0.5) x 4
  EXPECT_EQ(m, (std::vector<float>{2.0f, 4.0f}));      // the last step's momentum kept
  // Say the mean came back as fused = {8, 4}: m' = {2, 1}; r = (m' - 0.5 m) / 0.5 = {2, -2};
  // v_fresh = 0.75 x 4 + 0.25 x 4 = 4 for both; u0 = m' / sqrt(v) with v = {4, 1}: {1, 1};
  // decay 0.5: u = u0 + 0.5 p = {2, 0}; stats: sum u0^2 = 2, sum u^2 = 4, max ratio 2/2, 1/2.
  std::vector<float> p = {2.0f, -2.0f}, v = {4.0f, 1.0f}, fresh = {4.0f, 4.0f}, update(2);
  std::vector<float> stats = {0.5f, 0.0f, 0.0f};
  fused = {8.0f, 4.0f};
  OneBitAdamHyper d = h;
  d.weight_decay = 0.5f;
  ASSERT_TRUE(OneBitLambReconstruct(d, 4.0f, F32(p), F32(fused), F32(m), F32(v), F32(fresh),
                                    F32(update), F32(stats), nullptr)
                  .ok());
  EXPECT_EQ(m, (std::vector<float>{2.0f, 1.0f}));
  EXPECT_EQ(fresh, (std::vector<float>{4.0f, 4.0f}));
  EXPECT_EQ(update, (std::vector<float>{2.0f, 0.0f}));
  EXPECT_EQ(stats, (std::vector<float>{2.5f, 4.0f, 1.0f}));  // sums added, the ratio maxed
  EXPECT_EQ(p, (std::vector<float>{2.0f, -2.0f}));           // untouched: LambApply's
  // A scaling coefficient that is not positive is refused (the reconstruction divides by it).
  EXPECT_FALSE(OneBitLambReconstruct(d, 0.0f, F32(p), F32(fused), F32(m), F32(v), F32(fresh),
                                     F32(update), F32(stats), nullptr)
                   .ok());
}

}  // namespace
}  // namespace zerort
