// Rotary scaling ([Note: rotary scaling] in kernels/rope.h) by what each remap must do, derived
// here independently of the formula: linear scaling turns position f t as the unscaled rotation
// turns position t; LLaMA 3.1's bands for LLaMA 3.1 8B's shape (head size 128, theta 500000,
// factor 8, bands 1 and 4 of an 8192 context) are the counts the logarithms give (29 pairs kept,
// 6 blended, 29 divided), the blended ones between the two and the whole table decreasing; and the
// CPU backward is the forward's transpose under every scaling; YaRN's ramp for Qwen2.5's shape by
// the same counts, and its attention factor; dynamic NTK as the unscaled rotation of a larger
// base beyond the original context and the unscaled one within it. (The values themselves are
// checked against PyTorch references by the llama31_tiny, qwen2_yarn_tiny and llama_dynamic_tiny
// golden models.)
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/kernels/rope.h"

namespace zerort {
namespace {

constexpr int kHeadSize = 8, kSeq = 12, kHeads = 2, kKvHeads = 1;
constexpr int kRow = (kHeads + 2 * kKvHeads) * kHeadSize;  // [Note: the qkv layout]

// Rotated q of every row: the query heads of each qkv row, [seq, heads hs].
std::vector<double> RotatedQ(const Rope& rope, const std::vector<double>& q,
                             const std::vector<double>& kv) {
  std::vector<double> qkv(static_cast<size_t>(kSeq) * kRow);
  cpu::RopeQkvForward<double>(qkv.data(), q.data(), kv.data(), kv.data(), 1, kSeq, kHeads, kKvHeads,
                              kHeadSize, rope);
  std::vector<double> out;
  for (int t = 0; t < kSeq; ++t) {
    const double* row = qkv.data() + static_cast<size_t>(t) * kRow;
    out.insert(out.end(), row, row + kHeads * kHeadSize);
  }
  return out;
}

TEST(RopeTest, LinearScalingTurnsPositionFactorTimesTAsUnscaledT) {
  // Every row holds the same q, so a row's rotation differs only by its position.
  std::vector<double> one = testing::RandomNormal<double>(kHeads * kHeadSize, 1, 1.0);
  std::vector<double> q, kv(static_cast<size_t>(kSeq) * kKvHeads * kHeadSize, 0.0);
  for (int t = 0; t < kSeq; ++t) q.insert(q.end(), one.begin(), one.end());
  const Rope plain{.theta = 1000.0};
  const Rope linear{.theta = 1000.0, .scaling = {.type = RopeType::kLinear, .factor = 3}};
  const std::vector<double> a = RotatedQ(plain, q, kv), b = RotatedQ(linear, q, kv);
  const int width = kHeads * kHeadSize;
  for (int t = 0; 3 * t < kSeq; ++t) {
    for (int c = 0; c < width; ++c) {
      EXPECT_NEAR(b[3 * t * width + c], a[t * width + c], 1e-12) << "position " << 3 * t;
    }
  }
  EXPECT_GT(std::abs(b[width] - a[width]), 1e-3);  // position 1 does turn less
}

TEST(RopeTest, Llama3BandsOfLlama31_8B) {
  const Rope plain{.theta = 500000.0};
  const Rope scaled{.theta = 500000.0,
                    .scaling = {.type = RopeType::kLlama3,
                                .factor = 8,
                                .low_freq_factor = 1,
                                .high_freq_factor = 4,
                                .original_max_position_embeddings = 8192}};
  int kept = 0, blended = 0, divided = 0;
  double previous = INFINITY;
  for (int i = 0; i < 64; ++i) {
    const double f = RopeInvFreq(plain, i, 128), s = RopeInvFreq(scaled, i, 128);
    if (s == f) {
      ++kept;
    } else if (std::abs(s - f / 8) <= 1e-15 * f) {
      ++divided;
    } else {
      ++blended;
      EXPECT_GT(s, f / 8) << i;
      EXPECT_LT(s, f) << i;
    }
    EXPECT_LT(s, previous) << i;  // the remap keeps the frequencies' order
    previous = s;
  }
  // Kept: 2 pi / inv_freq < 8192 / 4, i.e. i < 64 ln(2048 / 2 pi) / ln(500000) = 28.2; divided:
  // above 8192 / 1, i > 64 ln(8192 / 2 pi) / ln(500000) = 34.98.
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(blended, 6);
  EXPECT_EQ(divided, 29);
}

// YaRN for Qwen2.5's 128K (head size 128, theta 10^6, factor 4 over a 32768 context): pair i
// turns 32768 theta^(-2i / 128) / (2 pi) times over the context, more than beta_fast = 32 times
// for i < 64 ln(32768 / 64 pi) / ln 10^6 = 23.6 and fewer than beta_slow = 1 for i > 39.65, so
// the ramp runs from pair 23 to pair 40: 24 pairs kept (0-23), 16 blended (24-39, each its share
// (i - 23) / 17 interpolated), 24 divided by 4 (40-63).
TEST(RopeTest, YarnRampOfQwen25) {
  const Rope plain{.theta = 1e6};
  const Rope yarn{
      .theta = 1e6,
      .scaling = {.type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 32768}};
  int kept = 0, blended = 0, divided = 0;
  double previous = INFINITY;
  for (int i = 0; i < 64; ++i) {
    const double f = RopeInvFreq(plain, i, 128), s = RopeInvFreq(yarn, i, 128);
    if (s == f) {
      ++kept;
    } else if (std::abs(s - f / 4) <= 1e-15 * f) {
      ++divided;
    } else {
      ++blended;
      const double share = (i - 23) / 17.0;
      EXPECT_NEAR(s, share * f / 4 + (1 - share) * f, 1e-15 * f) << i;
    }
    EXPECT_LT(s, previous) << i;
    previous = s;
  }
  EXPECT_EQ(kept, 24);
  EXPECT_EQ(blended, 16);
  EXPECT_EQ(divided, 24);
  // beta_fast 16 and beta_slow 2 narrow the ramp: 64 ln(32768 / 32 pi) / ln 10^6 = 26.8 and
  // 64 ln(32768 / 4 pi) / ln 10^6 = 36.4, so pairs 0-26 kept and 37-63 divided.
  Rope narrow = yarn;
  narrow.scaling.beta_fast = 16;
  narrow.scaling.beta_slow = 2;
  EXPECT_EQ(RopeInvFreq(narrow, 26, 128), RopeInvFreq(plain, 26, 128));
  EXPECT_NE(RopeInvFreq(narrow, 27, 128), RopeInvFreq(plain, 27, 128));
  EXPECT_NEAR(RopeInvFreq(narrow, 37, 128), RopeInvFreq(plain, 37, 128) / 4, 1e-30);
  EXPECT_GT(RopeInvFreq(narrow, 36, 128), RopeInvFreq(plain, 36, 128) / 4);
}

// YaRN's attention factor: 0.1 ln(factor) + 1 by default, attention_factor where given,
// DeepSeek's ratio of two mscales where both are set, 1 for a factor of 1 and for every other
// scaling.
TEST(RopeTest, YarnAttentionFactor) {
  Rope r{.theta = 1e4,
         .scaling = {.type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 64}};
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(r), 1 + 0.1 * std::log(4.0));
  EXPECT_EQ(RopeCosSinScale(r), static_cast<float>(1 + 0.1 * std::log(4.0)));
  r.scaling.mscale = 1;
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(r), 1 + 0.1 * std::log(4.0));  // mscale alone: unused
  r.scaling.factor = 40;
  r.scaling.mscale_all_dim = 0.5;
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(r),
                   (1 + 0.1 * std::log(40.0)) / (1 + 0.05 * std::log(40.0)));
  r.scaling.mscale_all_dim = 1;  // DeepSeek-V3's: the two cancel
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(r), 1.0);
  r.scaling.attention_factor = 0.75;
  EXPECT_EQ(RopeAttentionFactor(r), 0.75);
  r.scaling = {.type = RopeType::kYarn, .factor = 1, .original_max_position_embeddings = 64};
  EXPECT_EQ(RopeAttentionFactor(r), 1.0);
  EXPECT_EQ(RopeAttentionFactor(Rope{.scaling = {RopeType::kLinear, 4}}), 1.0);
  EXPECT_EQ(RopeAttentionFactor(Rope{.scaling = {RopeType::kLlama3, 8, 1, 4, 64}}), 1.0);
}

// The attention factor scales the float kernels' output and nothing else: a factor of 2 (a power
// of two, so every product exact) doubles every rotated channel, bit for bit, and leaves the
// values alone; with the default factor the backward is still the forward's transpose (below).
TEST(RopeTest, TheAttentionFactorScalesTheTurnedChannels) {
  const int rows = kSeq, C = kHeads * kHeadSize, KV = kKvHeads * kHeadSize;
  Rope one{.theta = 1000.0,
           .scaling = {.type = RopeType::kYarn,
                       .factor = 4,
                       .original_max_position_embeddings = 64,
                       .attention_factor = 1}};
  Rope two = one;
  two.scaling.attention_factor = 2;
  const std::vector<float> q = testing::RandomNormal<float>(rows * C, 6, 1.0),
                           k = testing::RandomNormal<float>(rows * KV, 7, 1.0),
                           v = testing::RandomNormal<float>(rows * KV, 8, 1.0);
  std::vector<float> a(rows * kRow), b(rows * kRow);
  cpu::RopeQkvForward<float>(a.data(), q.data(), k.data(), v.data(), 1, kSeq, kHeads, kKvHeads,
                             kHeadSize, one);
  cpu::RopeQkvForward<float>(b.data(), q.data(), k.data(), v.data(), 1, kSeq, kHeads, kKvHeads,
                             kHeadSize, two);
  for (int i = 0; i < rows * kRow; ++i) {
    const bool value = i % kRow >= C + KV;
    EXPECT_EQ(b[i], value ? a[i] : 2 * a[i]) << i;
  }
}

// Dynamic NTK is a change of base and nothing else: at a seq_len within the original context
// (or unknown, 0) the unscaled frequencies exactly; beyond it, pair i's frequency is the unscaled
// one of a base B with B^(hs - 2) = theta^(hs - 2) (factor T / L - factor + 1)^hs, so the
// highest pair's frequency times B^((hs - 2) / hs) is 1; every pair but the first (1 at any
// base) turns slower, the more so the longer T.
TEST(RopeTest, DynamicNtkRaisesTheBaseBeyondTheOriginalContext) {
  const int hs = 8, context = 64;
  const RopeScaling dynamic{
      .type = RopeType::kDynamic, .factor = 4, .original_max_position_embeddings = context};
  const Rope plain{.theta = 1000.0};
  for (int seq : {0, 1, 16, context}) {
    const Rope within{.theta = 1000.0, .scaling = dynamic, .seq_len = seq};
    for (int i = 0; i < hs / 2; ++i) {
      EXPECT_EQ(RopeInvFreq(within, i, hs), RopeInvFreq(plain, i, hs)) << seq << " " << i;
    }
  }
  double last = 1.0;
  for (int seq : {2 * context, 4 * context, 100 * context}) {
    const Rope beyond{.theta = 1000.0, .scaling = dynamic, .seq_len = seq};
    const double ratio = 4.0 * seq / context - 3.0;  // factor T / L - (factor - 1)
    const double base_power = std::pow(1000.0, hs - 2.0) * std::pow(ratio, hs);  // B^(hs - 2)
    const double top = RopeInvFreq(beyond, hs / 2 - 1, hs);  // B^(-(hs - 2) / hs)
    EXPECT_NEAR(top * std::pow(base_power, 1.0 / hs), 1.0, 1e-12) << seq;
    EXPECT_EQ(RopeInvFreq(beyond, 0, hs), 1.0);
    for (int i = 1; i < hs / 2; ++i) {
      EXPECT_LT(RopeInvFreq(beyond, i, hs), RopeInvFreq(plain, i, hs)) << seq << " " << i;
    }
    EXPECT_LT(top, last) << seq;
    last = top;
  }
}

TEST(RopeTest, BackwardIsTheForwardsTransposeUnderEveryScaling) {
  const int rows = kSeq, C = kHeads * kHeadSize, KV = kKvHeads * kHeadSize;
  for (const Rope& rope :
       {Rope{.theta = 1000.0}, Rope{.theta = 1000.0, .scaling = {RopeType::kLinear, 4}},
        Rope{.theta = 1000.0, .scaling = {RopeType::kLlama3, 8, 1, 4, 64}},
        Rope{.theta = 1000.0,
        .scaling = {.type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 64}},
        Rope{.theta = 1000.0,
        .scaling = {.type = RopeType::kDynamic, .factor = 2, .original_max_position_embeddings = 4},
        .seq_len = kSeq}}) {
    const std::vector<double> q = testing::RandomNormal<double>(rows * C, 2, 1.0),
                              k = testing::RandomNormal<double>(rows * KV, 3, 1.0),
                              v = testing::RandomNormal<double>(rows * KV, 4, 1.0),
                              r = testing::RandomNormal<double>(rows * kRow, 5, 1.0);
    std::vector<double> qkv(rows * kRow), dq(rows * C), dk(rows * KV), dv(rows * KV);
    cpu::RopeQkvForward<double>(qkv.data(), q.data(), k.data(), v.data(), 1, kSeq, kHeads, kKvHeads,
                                kHeadSize, rope);
    cpu::RopeQkvBackward<double>(dq.data(), dk.data(), dv.data(), r.data(), 1, kSeq, kHeads,
                                 kKvHeads, kHeadSize, rope);
    double forward = 0, backward = 0;
    for (size_t i = 0; i < qkv.size(); ++i) forward += r[i] * qkv[i];
    for (size_t i = 0; i < q.size(); ++i) backward += dq[i] * q[i];
    for (size_t i = 0; i < k.size(); ++i) backward += dk[i] * k[i] + dv[i] * v[i];
    EXPECT_NEAR(forward, backward, 1e-10 * std::abs(forward)) << RopeInvFreq(rope, 3, 8);

    // In place ([Note: a LLaMA block's projections]; the planar forward lays q, k, v out and
    // turns them so): q, k, v unrotated in qkv's layout turn into bitwise the forward's qkv; r
    // turned back in place is bitwise the backward's dq, dk, dv (each added into zeros), in its
    // layout, and the backward is checked above as the forward's transpose.
    std::vector<double> inplace(rows * kRow), back = r;
    for (int row = 0; row < rows; ++row) {
      std::copy_n(q.begin() + row * C, C, inplace.begin() + row * kRow);
      std::copy_n(k.begin() + row * KV, KV, inplace.begin() + row * kRow + C);
      std::copy_n(v.begin() + row * KV, KV, inplace.begin() + row * kRow + C + KV);
    }
    cpu::RopeQkvInPlace<double>(inplace.data(), 1, kSeq, kHeads, kKvHeads, kHeadSize, rope, false);
    EXPECT_EQ(inplace, qkv);
    cpu::RopeQkvInPlace<double>(back.data(), 1, kSeq, kHeads, kKvHeads, kHeadSize, rope, true);
    std::vector<double> planar(rows * kRow);
    for (int row = 0; row < rows; ++row) {
      std::copy_n(dq.begin() + row * C, C, planar.begin() + row * kRow);
      std::copy_n(dk.begin() + row * KV, KV, planar.begin() + row * kRow + C);
      std::copy_n(dv.begin() + row * KV, KV, planar.begin() + row * kRow + C + KV);
    }
    EXPECT_EQ(back, planar);
  }
}

// What a CUDA run checks before it starts (the rotary kernels' argument holds 256 frequencies).
TEST(RopeTest, CudaRunsRefuseHeadSizesAbove512ByName) {
  EXPECT_TRUE(CheckCudaRope(128).ok());
  EXPECT_TRUE(CheckCudaRope(512).ok());
  const Status wide = CheckCudaRope(514);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wide.message(), "head size 514: the CUDA rotary embeddings take head sizes up to 512");
}

}  // namespace
}  // namespace zerort
