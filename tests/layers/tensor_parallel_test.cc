// The tensor-parallel global frame: each rank's part of every GPT parameter, initialised on its
// own, equals the same elements of the whole tensor initialised at tensor-parallel size 1 (so
// initial weights do not depend on the TP size); split parameters are covered exactly once;
// the fused QKV weight splits per head (Q, K and V of the same heads on one rank), row-parallel
// weights split their input columns and keep their bias whole; bad splits are refused.
#include <gtest/gtest.h>

#include "zerort/layers/decoder_model.h"

namespace zerort {
namespace {

DecoderConfig Config() { return DecoderConfig{2, 4, 32, 16, 64}; }  // layers, heads, d, seq, vocab

TEST(TensorParallelFrame, EveryRanksPartEqualsTheWholeTensorsElements) {
  const DecoderConfig c = Config();
  const Initializer init = DecoderInitializer(c);
  const std::vector<DecoderUnit> whole = *DecoderUnits(c, 1, 0);
  for (int tp : {2, 4}) {
    std::vector<std::vector<DecoderUnit>> ranks;
    for (int r = 0; r < tp; ++r) ranks.push_back(*DecoderUnits(c, tp, r));
    for (size_t u = 0; u < whole.size(); ++u) {
      for (size_t p = 0; p < whole[u].params.size(); ++p) {
        const ParamSpec& g = whole[u].params[p];
        std::vector<float> global(g.numel());
        init(g, 1234, global);
        std::vector<int> covered(g.numel(), 0);
        for (int r = 0; r < tp; ++r) {
          const ParamSpec& local = ranks[r][u].params[p];
          ASSERT_EQ(local.global_shape(), g.shape) << local.name;
          std::vector<float> part(local.numel());
          init(local, 1234, part);
          for (int64_t i = 0; i < local.numel(); ++i) {
            const int64_t at = GlobalIndex(local, i);
            ASSERT_EQ(part[i], global[at]) << local.name << " tp " << tp << " rank " << r;
            ++covered[at];
          }
        }
        const int expected =
            g.frame.split_dim < 0 && ranks[0][u].params[p].frame.split_dim < 0 ? tp : 1;
        for (int64_t i = 0; i < g.numel(); ++i) {
          ASSERT_EQ(covered[i], expected) << g.name << " element " << i << " tp " << tp;
        }
      }
    }
  }
}

TEST(TensorParallelFrame, FusedQkvSplitsPerHeadAndRowParallelSplitsColumns) {
  const DecoderConfig c = Config();
  const int64_t d = c.d_model;
  const std::vector<DecoderUnit> rank1 = *DecoderUnits(c, 2, 1);
  const ParamSpec& qkv = rank1[1].params[2];
  ASSERT_EQ(qkv.name, "blocks.0.attn.qkv.weight");
  EXPECT_EQ(qkv.shape, (Shape{3 * d / 2, d}));
  // Local rows [0, d/2) are Q of heads 2-3, [d/2, d) their K, [d, 3d/2) their V.
  EXPECT_EQ(GlobalIndex(qkv, 0), (d / 2) * d);
  EXPECT_EQ(GlobalIndex(qkv, (d / 2) * d), (d + d / 2) * d);
  EXPECT_EQ(GlobalIndex(qkv, d * d + 3), (2 * d + d / 2) * d + 3);
  const ParamSpec& proj = rank1[1].params[4];
  ASSERT_EQ(proj.name, "blocks.0.attn.proj.weight");
  EXPECT_EQ(proj.shape, (Shape{d, d / 2}));
  EXPECT_EQ(GlobalIndex(proj, d / 2 + 1), d + d / 2 + 1);             // row 1, local column 1
  EXPECT_EQ(rank1[1].params[5].shape, (Shape{d}));                    // its bias: whole, added once
  EXPECT_EQ(rank1[0].params[0].shape, (Shape{c.vocab_size / 2, d}));  // vocabulary-parallel
}

TEST(TensorParallelFrame, SplitsThatDoNotDivideAreRefused) {
  StatusOr<ParamSpec> bad = SplitParam("w", {10, 4}, true, {.split_dim = 0, .parts = 4});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos) << bad.status();
  EXPECT_FALSE(SplitParam("qkv", {18, 4}, true, {.split_dim = 0, .parts = 4, .groups = 3}).ok());
  EXPECT_TRUE(SplitParam("qkv", {24, 4}, true, {.split_dim = 0, .parts = 4, .groups = 3}).ok());
  EXPECT_FALSE(DecoderUnits(Config(), 3, 0).ok());  // 4 heads over 3 ranks
  EXPECT_FALSE(DecoderUnits(Config(), 2, 2).ok());  // no rank 2 of 2
}

}  // namespace
}  // namespace zerort
