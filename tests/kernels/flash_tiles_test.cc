// [Note: flash attention's block programs] (kernels/flash_tiles.h) on the CPU: the CUDA flash
// kernel's block programs, run warp by warp and lane by lane over every block of their grids by
// a CPU executor whose tensor-core product is a loop (tests/kernels/flash_harness.h), against the
// double reference attention (kernels/model_ops.h), in bf16 and fp16, head sizes 64 and 128,
// sequence lengths with tails and whole tiles, multi-head and grouped-query. What the GPU adds
// over this is wmma's own accumulation order and the real concurrency of the lanes, which the
// note's phase rule makes irrelevant (flash_attention_cuda_test.cc runs the same cases there).
#include "tests/kernels/flash_harness.h"
#include "zerort/kernels/flash_attention.h"

namespace zerort::testing {
namespace {

TEST(FlashTilesTest, ForwardAndBackwardAgainstTheDoubleReference) {
  for (const FlashCase& c : FlashCases()) {
    const FlashInputs in = MakeFlashInputs(c);
    ExpectFlashMatchesReference(in, RunFlashOnCpu(in));
  }
}

TEST(FlashTilesTest, TheProgramsCheckTheirShapes) {
  using internal::CheckFlashAttention;
  using internal::FlashAttentionShape;
  EXPECT_TRUE(CheckFlashAttention(DType::kBF16, {2, 100, 4, 2, 64}).ok());
  EXPECT_TRUE(CheckFlashAttention(DType::kF16, {1, 1, 1, 1, 128}).ok());
  const Status fp32 = CheckFlashAttention(DType::kF32, {1, 8, 2, 2, 64});
  EXPECT_NE(fp32.message().find("bf16 or fp16"), std::string_view::npos) << fp32;
  const Status hs = CheckFlashAttention(DType::kBF16, {1, 8, 2, 2, 96});
  EXPECT_NE(hs.message().find("96"), std::string_view::npos) << hs;
  EXPECT_FALSE(CheckFlashAttention(DType::kBF16, {1, 8, 3, 2, 64}).ok());       // 3 over 2
  EXPECT_FALSE(CheckFlashAttention(DType::kBF16, {4096, 8, 32, 32, 64}).ok());  // grid's y
}

}  // namespace
}  // namespace zerort::testing
