// FlatLayout: alignment, padding of uneven sizes, shard pieces that tile every parameter once.
#include "zerort/sharding/flat_layout.h"

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(FlatLayoutTest, PadsUnevenSizesAndAlignsParameters) {
  auto layout = *FlatLayout::Create({{"w", {13, 7}}, {"b", {13}, false}, {"g", {5}}}, 3);
  EXPECT_EQ(layout.params_numel(), 91 + 13 + 5);
  EXPECT_EQ(layout.flat_range(0), (Range{0, 91}));
  EXPECT_EQ(layout.flat_range(1), (Range{96, 109}));  // aligned to 16 elements
  EXPECT_EQ(layout.flat_range(2), (Range{112, 117}));
  EXPECT_EQ(layout.padded_numel() % (3 * 16), 0);
  EXPECT_GE(layout.padded_numel(), 117);
  EXPECT_EQ(layout.shard_numel() * 3, layout.padded_numel());
}

TEST(FlatLayoutTest, PiecesCoverEveryParameterExactlyOnce) {
  for (int dp : {1, 2, 3, 4, 7, 64}) {
    auto layout =
        *FlatLayout::Create({{"a", {1000, 3}}, {"b", {1}}, {"c", {17, 17}}, {"d", {0}}}, dp);
    std::vector<std::vector<int>> covered(4);
    for (int i = 0; i < 4; ++i) covered[i].assign(layout.params()[i].numel(), 0);
    for (int r = 0; r < dp; ++r) {
      for (const ShardPiece& p : layout.ShardPieces(r)) {
        ASSERT_EQ(p.param_range.size(), p.shard_range.size());
        ASSERT_GE(p.shard_range.begin, 0);
        ASSERT_LE(p.shard_range.end, layout.shard_numel());
        // The piece sits where the flat layout says.
        ASSERT_EQ(layout.flat_range(p.param).begin + p.param_range.begin,
                  r * layout.shard_numel() + p.shard_range.begin);
        for (int64_t k = p.param_range.begin; k < p.param_range.end; ++k) ++covered[p.param][k];
      }
    }
    for (const auto& c : covered) {
      for (int n : c) ASSERT_EQ(n, 1) << "dp " << dp;
    }
  }
}

TEST(FlatLayoutTest, RejectsBadInput) {
  EXPECT_FALSE(FlatLayout::Create({}, 2).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {2}}, {"a", {3}}}, 2).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {-1}}}, 2).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {2}}}, 0).ok());
}

}  // namespace
}  // namespace zerort

namespace zerort {
namespace {

// Local runs of ContiguousRun elements are contiguous in the global tensor, for column, row,
// per-head (grouped) and replicated splits; the global positions of all parts cover the tensor
// once.
TEST(FlatLayoutTest, ContiguousRunsOfEverySplit) {
  struct Case {
    Shape shape;
    int dim, groups;
  };
  for (const Case& c : {Case{{12, 4}, 0, 1}, Case{{12, 4}, 0, 3}, Case{{4, 12}, 1, 1},
                        Case{{2, 6, 4}, 1, 3}, Case{{5, 3}, -1, 1}}) {
    for (int parts : {1, 2}) {
      std::vector<int> seen(NumElements(c.shape), 0);
      for (int part = 0; part < parts; ++part) {
        const ParamSpec s =
            *SplitParam("p", c.shape, true,
                        {.split_dim = c.dim, .parts = parts, .part = part, .groups = c.groups});
        const int64_t run = ContiguousRun(s);
        ASSERT_EQ(s.numel() % run, 0);
        for (int64_t i = 0; i < s.numel(); ++i) {
          ++seen[GlobalIndex(s, i)];
          if (i % run != 0) {
            EXPECT_EQ(GlobalIndex(s, i), GlobalIndex(s, i - 1) + 1) << i;
          }
        }
      }
      for (int v : seen) EXPECT_EQ(v, c.dim < 0 ? parts : 1);  // replicated: every part
    }
  }
  ParamSpec padded = *SplitParam("wte", {8, 3}, true, {.split_dim = 0, .parts = 2, .part = 1});
  padded.frame.valid_rows = 7;
  EXPECT_EQ(padded.real_shape(), (Shape{7, 3}));
  EXPECT_EQ(padded.real_numel(), 21);
  // Part 1 holds rows 4..7 of 8; row 7 is padding: one run of rows 4..6, none for row 7.
  const std::vector<GlobalRun> runs = RealGlobalRuns(padded, 0, padded.numel());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].local, 0);
  EXPECT_EQ(runs[0].global, 12);
  EXPECT_EQ(runs[0].length, 9);
  // A row-parallel part: one run per row, from the middle of a row.
  const ParamSpec row = *SplitParam("w", {3, 4}, true, {.split_dim = 1, .parts = 2, .part = 1});
  const std::vector<GlobalRun> rows = RealGlobalRuns(row, 1, 6);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].global, 3);
  EXPECT_EQ(rows[0].length, 1);
  EXPECT_EQ(rows[1].global, 6);
  EXPECT_EQ(rows[2].global, 10);
  EXPECT_EQ(rows[2].length, 2);
}

}  // namespace
}  // namespace zerort
