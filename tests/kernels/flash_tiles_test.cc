// [Note: flash attention's block programs] (kernels/flash_tiles.h) on the CPU: the CUDA flash
// kernel's block programs, run warp by warp and lane by lane over every block of their grids by
// a CPU executor that emulates each warp instruction (ldmatrix, mma.sync, the shuffles, cp.async)
// by its PTX fragment layout (tests/kernels/flash_harness.h), against the double reference
// attention (kernels/model_ops.h), in bf16 and fp16, head sizes 64 and 128, sequence lengths with
// tails and whole tiles, multi-head and grouped-query. What the GPU adds over this is that the
// hardware's layouts are the ones emulated, the tensor cores' own accumulation order, ex2.approx,
// and the real concurrency of the lanes, which the note's phase rule makes irrelevant
// (flash_attention_cuda_test.cc runs the same cases there).
#include "tests/kernels/flash_harness.h"
#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_kernels.h"

namespace zerort::testing {
namespace {

TEST(FlashTilesTest, ForwardAndBackwardAgainstTheDoubleReference) {
  for (const FlashCase& c : FlashCases()) {
    const FlashInputs in = MakeFlashInputs(c);
    ExpectFlashMatchesReference(in, RunFlashOnCpu(in));
  }
}

// At head size 64 the forward also runs with 128-query blocks, two row groups a warp ([Note:
// the register-resident forward]; `bench attention` times it beside the default), checked the
// same way, and bit for bit the default's outputs (each group's queries meet the same key tiles
// in the same order, its products in the same order).
TEST(FlashTilesTest, TheHundredTwentyEightQueryForwardAtHeadSize64) {
  for (const FlashCase& c : FlashCases()) {
    if (c.hs != 64) continue;
    const FlashInputs in = MakeFlashInputs(c);
    const FlashOutputs two =
        c.bf16 ? RunFlashOnCpuAs<true, 64, 2>(in) : RunFlashOnCpuAs<false, 64, 2>(in);
    ExpectFlashMatchesReference(in, two);
    const FlashOutputs one = RunFlashOnCpu(in);
    EXPECT_EQ(two.out, one.out) << "two row groups' outputs are not the default's";
    EXPECT_EQ(two.lse, one.lse) << "nor their log-sum-exps";
  }
}

// At head size 128 the forward's 128-query blocks are 8 warps of one row group ([Note: the
// register-resident forward]; `bench attention` times them beside the default), checked the same
// way; and the 8-warp program at head size 64 too (not launched there: 128 queries take two row
// groups on 4 warps), whose tiles at 64 columns a row the copies divide otherwise. A warp's
// queries meet the same 64-key tiles in the same order whatever the block's warps, so the
// outputs and log-sum-exps are the default's bit for bit: a run may take either.
TEST(FlashTilesTest, TheEightWarpForward) {
  for (const FlashCase& c : FlashCases()) {
    const FlashInputs in = MakeFlashInputs(c);
    FlashOutputs eight, four;
    if (c.hs == 128) {
      eight = c.bf16 ? RunFlashOnCpuAs<true, 128, 1, 32, 4, 8>(in)
                     : RunFlashOnCpuAs<false, 128, 1, 32, 4, 8>(in);
    } else {
      eight = c.bf16 ? RunFlashOnCpuAs<true, 64, 1, 64, 4, 8>(in)
                     : RunFlashOnCpuAs<false, 64, 1, 64, 4, 8>(in);
    }
    ExpectFlashMatchesReference(in, eight);
    four = RunFlashOnCpu(in);
    EXPECT_EQ(eight.out, four.out) << "the 8-warp forward's outputs are not the default's";
    EXPECT_EQ(eight.lse, four.lse) << "nor its log-sum-exps";
  }
}

// At head size 64 the backward's main program also runs with 32-query chunks (kBackwardChunk in
// kernels/flash_backward.h; `bench attention` times it beside the default), checked the same way.
TEST(FlashTilesTest, TheThirtyTwoQueryBackwardChunkAtHeadSize64) {
  for (const FlashCase& c : FlashCases()) {
    if (c.hs != 64) continue;
    const FlashInputs in = MakeFlashInputs(c);
    ExpectFlashMatchesReference(
        in, c.bf16 ? RunFlashOnCpuAs<true, 64, 1, 32>(in) : RunFlashOnCpuAs<false, 64, 1, 32>(in));
  }
}

// At head size 64 the backward's main program also runs with 8 warps and 128-key blocks (both
// query chunks; `bench attention` times it beside the default), checked the same way.
TEST(FlashTilesTest, TheHundredTwentyEightKeyBackwardAtHeadSize64) {
  for (const FlashCase& c : FlashCases()) {
    if (c.hs != 64) continue;
    const FlashInputs in = MakeFlashInputs(c);
    ExpectFlashMatchesReference(in, c.bf16 ? RunFlashOnCpuAs<true, 64, 1, 64, 8>(in)
                                           : RunFlashOnCpuAs<false, 64, 1, 64, 8>(in));
    ExpectFlashMatchesReference(in, c.bf16 ? RunFlashOnCpuAs<true, 64, 1, 32, 8>(in)
                                           : RunFlashOnCpuAs<false, 64, 1, 32, 8>(in));
  }
}

// The executor's bank model ([Note: shared-memory wavefronts] in flash_harness.h), on accesses
// made by hand: what the programs' runs above count for their own accesses (RunFlashOnCpuAs
// expects none beyond the need) is only as good as this count.
TEST(FlashTilesTest, TheExecutorCountsBankConflicts) {
  const CpuFlashExec<true> x;
  std::vector<unsigned char> smem(flash::kTile * 64 * 2, 0);
  x.Watch(smem.data(), smem.size());
  auto* tile = reinterpret_cast<uint16_t*>(smem.data());
  CpuFlashExec<true>::Regs<uint32_t, 4> r;
  // A swizzled tile's 16 x 16 block: each matrix's 8 rows in 8 bank groups, one wavefront each.
  x.ForWarps([&](int w) {
    x.LdMatrix(w, r, 0, [&](int lane) { return flash::FragRowsFirst<64>(tile, 0, 0, lane); });
    x.LdMatrixTrans(w, r, 0, [&](int lane) { return flash::FragColsFirst<64>(tile, 16, 8, lane); });
  });
  EXPECT_EQ(x.conflicted(), 0) << x.conflict_report();
  // The same block of rows 128 bytes apart, unswizzled: a matrix's 8 rows in one bank group,
  // 8 wavefronts where 1 serves (4 matrices, 4 warps).
  x.ForWarps([&](int w) {
    x.LdMatrix(w, r, 0, [&](int lane) {
      return tile + (lane % 8 + 8 * (lane / 8 % 2)) * 64 + 8 * (lane / 16);
    });
  });
  EXPECT_EQ(x.conflicted(), 4);
  EXPECT_EQ(x.excess_wavefronts(), 4 * 4 * 7);
  EXPECT_NE(x.conflict_report().find("ldmatrix: 32 wavefronts where 4 serve"), std::string::npos)
      << x.conflict_report();
  // 32-bit stores: a row's 32 words (no conflict), then a column's (every lane in bank 0; each
  // store of another phase, so that no race is in the way).
  x.SyncBlock();
  x.ForWarps([&](int w) {
    if (w != 0) return;
    x.ForLanes([&](int lane) { x.Store32(tile + 2 * lane, 0); });
  });
  EXPECT_EQ(x.conflicted(), 4);
  x.SyncBlock();
  x.ForWarps([&](int w) {
    if (w != 0) return;
    x.ForLanes([&](int lane) { x.Store32(tile + lane * 64, 0); });
  });
  EXPECT_EQ(x.conflicted(), 5);
  EXPECT_EQ(x.excess_wavefronts(), 4 * 4 * 7 + 31);
  // Float loads of one word by every lane are one broadcast.
  x.ForWarps([&](int w) {
    x.ForLanes([&](int) { (void)x.LoadShared(reinterpret_cast<const float*>(tile + 8)); });
  });
  EXPECT_EQ(x.conflicted(), 5);
  // 16-byte copies a quarter warp at a time: the 8 chunks of one row take one wavefront (threads
  // 0 .. 63, rows 0 .. 7), the first chunks of 8 rows eight (threads 64 .. 119, rows 8 .. 63:
  // 7 quarters of warps 2 and 3; threads 120 .. 127 copy nothing).
  x.SyncBlock();
  const std::vector<uint16_t> from(8, 0);
  x.ForThreads([&](int t) {
    if (t >= 120) return;
    const int row = t < 64 ? t / 8 : t - 56, chunk = t < 64 ? t % 8 : 0;
    x.CpAsync16(tile + row * 64 + chunk * 8, from.data(), true);
  });
  x.CpAsyncCommit();
  x.CpAsyncWait(0);
  EXPECT_EQ(x.conflicted(), 7) << x.conflict_report();
  EXPECT_EQ(x.excess_wavefronts(), 4 * 4 * 7 + 31 + 7 * 7);
}

// The CPU model's 16-bit attention (widened to fp32, cpu::fast's flash) rounds P and dS to its
// format before their products as the CUDA programs do (cpu::fast::FlashAttentionForward's
// `products`), so that a bf16 run on the CPU and one on a GPU take the same roundings (cuda_parity
// compares their losses): its outputs and gradients are closer to the programs' than the same
// kernels' with P and dS kept in fp32. On 2026-11-30, before this, cuda_parity's bf16 flash run
// differed by 2.65e-3 at one step, against 7.8e-5 for the materialised bf16 one.
// Both sides take P from the same base-2 exponent (math::ProbExponent2), but their dot products
// and log-sum-exps differ in the last bits (about 30% of the rows' lse in these cases), so dS's
// 16-bit rounding still flips in places: 3.5e-5 to 8.8e-5 of the gradients, against 3.5e-4 to
// 3e-3 with P and dS kept in fp32. (Before 2026-11-30's base-2 exponent: 1.9e-5 to 6.2e-5, in dQ
// and dK, not dV. The exponent's form alone moves the flips: both sides back on the natural-base
// form give the old gaps to the digit, the whole-chunk masks kept; neither side's exp2 nor the
// fma's single rounding does it. At head size 128 it is the log-sum-exps rounded into base 2
// (without that rounding: 6.21e-5, the old gap); at 64 in fp16 the base itself (5.3e-5 even with
// the exponent rounded once from doubles). Against the double reference the programs are as
// accurate either way.)
TEST(FlashTilesTest, TheCpuModelKernelsRoundAsThePrograms) {
  for (const FlashCase& c : {FlashCase{true, 2, 100, 4, 2, 64}, FlashCase{false, 1, 100, 4, 2, 64},
                             FlashCase{true, 1, 130, 2, 2, 128}}) {
    SCOPED_TRACE(::testing::Message() << (c.bf16 ? "bf16" : "fp16") << " hs" << c.hs);
    const FlashInputs in = MakeFlashInputs(c);
    const FlashOutputs programs = RunFlashOnCpu(in);
    const int channels = c.heads * c.hs;
    // The model kernels on the 16-bit buffers, as a bf16/fp16 run calls them.
    auto model = MakeCpuModelKernels(c.bf16 ? CpuPrecision::kBf16 : CpuPrecision::kF16);
    std::vector<uint16_t> out(in.out_size()), dqkv = in.dqkv;
    std::vector<float> lse(in.stat_size());
    ASSERT_TRUE(model
                    ->Attention(out.data(), lse.data(), in.qkv.data(), c.batch, c.seq, channels,
                                c.heads, c.kv_heads)
                    .ok());
    ASSERT_TRUE(model
                    ->AttentionBackward(dqkv.data(), in.dout.data(), in.qkv.data(), out.data(),
                                        lse.data(), c.batch, c.seq, channels, c.heads, c.kv_heads)
                    .ok());
    // The same float kernels with nothing rounded before the products.
    auto widen = [&](const std::vector<uint16_t>& bits) {
      std::vector<float> v(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) v[i] = FlashToF(c.bf16, bits[i]);
      return v;
    };
    auto narrow = [&](const std::vector<float>& v) {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        bits[i] = c.bf16 ? FloatToBf16Bits(v[i]) : FloatToF16Bits(v[i]);
      }
      return bits;
    };
    const std::vector<float> qkv = widen(in.qkv), dout = widen(in.dout);
    std::vector<float> out_fp32(in.out_size()), lse_fp32(in.stat_size()),
        dqkv_fp32 = widen(in.dqkv);
    cpu::fast::FlashAttentionForward(out_fp32.data(), lse_fp32.data(), qkv.data(), c.batch, c.seq,
                                     channels, c.heads, c.kv_heads);
    const std::vector<float> out_read = widen(narrow(out_fp32));  // the stored output
    cpu::fast::FlashAttentionBackward(dqkv_fp32.data(), dout.data(), qkv.data(), out_read.data(),
                                      lse_fp32.data(), c.batch, c.seq, channels, c.heads,
                                      c.kv_heads);
    const std::vector<double> want_out = FlashValues(c.bf16, programs.out);
    const std::vector<double> want_grad = FlashValues(c.bf16, programs.dqkv);
    const double out_rounded = FlashRelativeError(FlashValues(c.bf16, out), want_out);
    const double out_kept = FlashRelativeError(FlashValues(c.bf16, narrow(out_fp32)), want_out);
    const double grad_rounded = FlashRelativeError(FlashValues(c.bf16, dqkv), want_grad);
    const double grad_kept = FlashRelativeError(FlashValues(c.bf16, narrow(dqkv_fp32)), want_grad);
    std::printf("%s hs%d: out %.3g (fp32 P: %.3g), gradients %.3g (fp32 P, dS: %.3g)\n",
                c.bf16 ? "bf16" : "fp16", c.hs, out_rounded, out_kept, grad_rounded, grad_kept);
    EXPECT_LT(out_rounded, 0.1 * out_kept);
    EXPECT_LT(grad_rounded, 0.2 * grad_kept);
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
  // The 1-D grids: 65535 heads x 31,250 tiles of 64 fit 2^31 - 1 blocks, 34,375 do not.
  EXPECT_TRUE(CheckFlashAttention(DType::kBF16, {65535, 2000000, 1, 1, 64}).ok());
  const Status blocks = CheckFlashAttention(DType::kBF16, {65535, 2200000, 1, 1, 64});
  EXPECT_NE(blocks.message().find("over 2^31 - 1"), std::string_view::npos) << blocks;
  // model.attention_backend: a flash request is checked, naming the key; the others pass.
  using internal::CheckAttentionBackend;
  const Status asked =
      CheckAttentionBackend(AttentionProgram::kFlash, {}, DType::kBF16, {1, 8, 2, 2, 96});
  EXPECT_NE(asked.message().find("model.attention_backend = \"flash\": flash attention on CUDA "
                                 "takes head sizes 64 and 128, not 96"),
            std::string_view::npos)
      << asked;
  EXPECT_TRUE(
      CheckAttentionBackend(AttentionProgram::kFlash, {}, DType::kF16, {1, 8, 2, 2, 64}).ok());
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {}, DType::kF32, {1, 8, 2, 2, 96}).ok());
  EXPECT_TRUE(
      CheckAttentionBackend(AttentionProgram::kMaterialised, {}, DType::kF32, {1, 8, 2, 2, 96})
          .ok());
  // cuDNN's attention: 16-bit, head sizes multiples of 8 up to 128, grouped heads; its own
  // messages name the key; model.flash_attention's block shapes are zerort's kernels', refused.
  EXPECT_TRUE(
      CheckAttentionBackend(AttentionProgram::kCudnn, {}, DType::kBF16, {1, 8, 4, 2, 96}).ok());
  EXPECT_TRUE(
      CheckAttentionBackend(AttentionProgram::kCudnn, {}, DType::kF16, {1, 8, 2, 2, 128}).ok());
  for (const auto& [dtype, shape, message] :
       {std::tuple<DType, internal::FlashAttentionShape, const char*>{
            DType::kF32, {1, 8, 2, 2, 64}, "takes bf16 or fp16, not f32"},
        {DType::kBF16, {1, 8, 2, 2, 100}, "multiples of 8 up to 128, not 100"},
        {DType::kBF16, {1, 8, 2, 2, 256}, "multiples of 8 up to 128, not 256"},
        {DType::kBF16, {1, 8, 3, 2, 64}, "3 query heads over 2 key/value heads"},
        {DType::kBF16, {2, 1, 2, 2, 64}, "does not take sequences of one token"}}) {
    const Status s = CheckAttentionBackend(AttentionProgram::kCudnn, {}, dtype, shape);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(std::string("model.attention_backend = \"cudnn\": ")),
              std::string_view::npos)
        << s;
    EXPECT_NE(s.message().find(message), std::string_view::npos) << s;
  }
  const Status tiles =
      CheckAttentionBackend(AttentionProgram::kCudnn, {0, 128, 0}, DType::kBF16, {1, 8, 2, 2, 64});
  EXPECT_NE(tiles.message().find("model.flash_attention is set, but model.attention_backend = "
                                 "\"cudnn\" runs cuDNN's attention"),
            std::string_view::npos)
      << tiles;
}

// A build without cudnn-frontend says how to build the cuDNN attention, and so does
// CudnnAttention::Create, which a run's CUDA kernels and `bench attention` call for it.
TEST(FlashTilesTest, AMissingCudnnAttentionSaysHowToBuildIt) {
  const Status built = internal::CudnnAttentionBuilt();
  if (built.ok()) GTEST_SKIP() << "this build has cuDNN's attention";
  EXPECT_EQ(built.code(), absl::StatusCode::kUnimplemented) << built;
  EXPECT_NE(built.message().find("model.attention_backend = \"cudnn\": this zerort was built "
                                 "without cuDNN's attention (configure a CUDA build with "
                                 "-DZR_CUDNN_FRONTEND=DIR"),
            std::string_view::npos)
      << built;
  std::unique_ptr<Stream> stream = *CreateStream(Device::Cpu(), "compute");
  EXPECT_EQ(internal::CudnnAttention::Create(*stream).status(), built);
}

// A build with it, on a machine without a GPU: libcudnn is opened through the frontend's dynamic
// loading and its handle refused, and the run is told so by name (exit 2), not crashed. (With a
// GPU, flash_attention_cuda_test runs it.)
TEST(FlashTilesTest, TheCudnnAttentionWithoutAGpuSaysWhy) {
  if (const Status built = internal::CudnnAttentionBuilt(); !built.ok()) {
    GTEST_SKIP() << built.message();
  }
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is here: flash_attention_cuda_test runs it";
  std::unique_ptr<Stream> stream = *CreateStream(Device::Cpu(), "compute");
  const StatusOr<std::unique_ptr<internal::CudnnAttention>> made =
      internal::CudnnAttention::Create(*stream);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnimplemented) << made.status();
  EXPECT_NE(made.status().message().find("model.attention_backend = \"cudnn\": "),
            std::string_view::npos)
      << made.status();
}

// model.flash_attention: each block shape the kernels are built with passes at its head size, and
// the others fail naming the key, the value and what the head size takes; block shapes need the
// flash program.
TEST(FlashTilesTest, TheBlockShapesAreCheckedAgainstTheHeadSize) {
  using internal::CheckAttentionBackend;
  const internal::FlashAttentionShape hs64{2, 100, 4, 2, 64}, hs128{2, 100, 4, 2, 128};
  for (const FlashTiles& t :
       {FlashTiles{}, FlashTiles{64, 64, 64}, FlashTiles{128, 0, 0}, FlashTiles{0, 128, 32},
        FlashTiles{128, 128, 32}, FlashTiles{128, 0, 0, 8}, FlashTiles{0, 0, 0, 8},
        FlashTiles{128, 0, 0, 4}, FlashTiles{64, 0, 0, 4}}) {
    EXPECT_TRUE(CheckAttentionBackend(std::nullopt, t, DType::kBF16, hs64).ok());
    EXPECT_TRUE(CheckAttentionBackend(AttentionProgram::kFlash, t, DType::kF16, hs64).ok());
  }
  for (const FlashTiles& t :
       {FlashTiles{64, 64, 0}, FlashTiles{0, 0, 32}, FlashTiles{128, 0, 0}, FlashTiles{128, 64, 32},
        FlashTiles{128, 0, 0, 8}, FlashTiles{0, 0, 0, 8}, FlashTiles{64, 0, 0, 4}}) {
    EXPECT_TRUE(CheckAttentionBackend(std::nullopt, t, DType::kBF16, hs128).ok());
  }
  const struct {
    FlashTiles tiles;
    internal::FlashAttentionShape shape;
    const char* message;
  } refused[] = {
      {{96, 0, 0},
       hs128,
       "model.flash_attention.forward_block_queries = 96 at head size 128 (0: the default, or "
       "64 or 128)"},
      {{128, 128, 0},
       hs128,
       "model.flash_attention.backward_block_keys = 128 at head size 128 (0: the default, or "
       "64)"},
      {{0, 0, 64},
       hs128,
       "model.flash_attention.backward_query_chunk = 64 at head size 128 (0: the default, or 32)"},
      {{96, 0, 0},
       hs64,
       "model.flash_attention.forward_block_queries = 96 at head size 64 (0: the default, or 64 or "
       "128)"},
      {{0, 0, 16}, hs64, "backward_query_chunk = 16 at head size 64 (0: the default, or 32 or 64)"},
      {{0, 0, 0, 6}, hs64, "forward_warps = 6 at head size 64 (0: the default, or 4 or 8)"},
      {{64, 0, 0, 8},
       hs64,
       "forward_block_queries = 64 with forward_warps = 8 at head size 64 (a forward block is 64 "
       "queries on 4 warps, or 128 on 8 or on 4; 0 takes the other field's match)"},
      {{128, 0, 0, 4},
       hs128,
       "forward_block_queries = 128 with forward_warps = 4 at head size 128 (a forward block is 64 "
       "queries on 4 warps, or 128 on 8; 0 takes the other field's match)"},
  };
  for (const auto& r : refused) {
    const Status s = CheckAttentionBackend(std::nullopt, r.tiles, DType::kBF16, r.shape);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(r.message), std::string_view::npos) << s;
  }
  // On the materialised program the block shapes would do nothing: refused, saying why.
  const Status asked =
      CheckAttentionBackend(AttentionProgram::kMaterialised, {128, 0, 0}, DType::kBF16, hs64);
  EXPECT_NE(asked.message().find("model.flash_attention is set, but this run's attention is the "
                                 "materialised program (model.attention_backend = "
                                 "\"materialised\")"),
            std::string_view::npos)
      << asked;
  const Status fp32 = CheckAttentionBackend(std::nullopt, {0, 128, 0}, DType::kF32, hs64);
  EXPECT_NE(fp32.message().find("materialised program (flash attention on CUDA takes bf16 or fp16, "
                                "not f32"),
            std::string_view::npos)
      << fp32;
}

// The flash programs' shared memory a block, from their layouts (kernels/flash_forward.h's
// ForwardSmem: the block's queries and two buffers each of K and V, 64 keys a tile; the
// backward's BackwardSmem: six tiles of its keys' rows, four statistics arrays, dS^T), and a
// device that allows less is told before the run starts which program and what to choose.
TEST(FlashTilesTest, TheBlocksMustFitTheDevicesSharedMemory) {
  using internal::CheckAttentionBackend;
  using internal::FlashSharedBytesOf;
  const auto bytes = [](const FlashTiles& t, int hs) {
    const internal::FlashSharedBytes b = FlashSharedBytesOf(t, hs);
    return std::pair{b.forward, b.backward};
  };
  // hs 64: Q 64 x 64 x 2 + 4 tiles of 64 x 64 x 2; backward 6 x 8 KiB + 4 x 64 x 4 + 64 x 64 x 2.
  EXPECT_EQ(bytes({}, 64), std::pair(8192 + 4 * 8192, 6 * 8192 + 1024 + 8192));
  EXPECT_EQ(bytes({128, 0, 0}, 64).first, 16384 + 4 * 8192);           // 128 queries on 4 warps
  EXPECT_EQ(bytes({128, 0, 0, 8}, 64).first, 16384 + 4 * 8192);        // or on 8
  EXPECT_EQ(bytes({0, 128, 0}, 64).second, 6 * 16384 + 2048 + 32768);  // 128-key blocks
  EXPECT_EQ(bytes({0, 0, 32}, 64).second, 6 * 8192 + 1024 + 8192);     // chunks: the same tiles
  // hs 128: the backward is 105 KiB.
  EXPECT_EQ(bytes({}, 128), std::pair(16384 + 4 * 16384, 6 * 16384 + 1024 + 8192));
  EXPECT_EQ(bytes({128, 0, 0}, 128).first, 32768 + 4 * 16384);

  const internal::FlashAttentionShape hs64{2, 100, 4, 2, 64}, hs128{2, 100, 4, 2, 128};
  constexpr int64_t kAda = 101376, kA100 = 166912, kH100 = 232448;  // opt-in bytes a block
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {}, DType::kBF16, hs64, kAda).ok());
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {}, DType::kBF16, hs128, kA100).ok());
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {0, 128, 0}, DType::kBF16, hs64, kA100).ok());
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {}, DType::kBF16, hs128, 0).ok());  // unknown
  const Status ada = CheckAttentionBackend(std::nullopt, {}, DType::kBF16, hs128, kAda);
  EXPECT_EQ(ada.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ada.message().find("zerort's flash attention at head size 128 takes 107520 bytes of "
                               "shared memory a block in its backward, more than the 101376 this "
                               "GPU allows: set model.attention_backend to \"materialised\""),
            std::string_view::npos)
      << ada;
  EXPECT_EQ(CheckAttentionBackend(AttentionProgram::kFlash, {}, DType::kF16, hs128, kAda), ada);
  const Status keys = CheckAttentionBackend(std::nullopt, {0, 128, 0}, DType::kBF16, hs64, kAda);
  EXPECT_NE(keys.message().find("takes 133120 bytes of shared memory a block in its backward "
                                "(model.flash_attention), more than the 101376"),
            std::string_view::npos)
      << keys;
  EXPECT_NE(keys.message().find(", or model.flash_attention's defaults"), std::string_view::npos);
  // Where the defaults do not fit either, they are not suggested.
  const Status neither =
      CheckAttentionBackend(std::nullopt, {0, 128, 0}, DType::kBF16, hs64, 50000);
  EXPECT_FALSE(neither.ok());
  EXPECT_EQ(neither.message().find("defaults"), std::string_view::npos) << neither;
  const Status forward = CheckAttentionBackend(std::nullopt, {}, DType::kBF16, hs64, 40000);
  EXPECT_NE(forward.message().find("takes 40960 bytes of shared memory a block in its forward"),
            std::string_view::npos)
      << forward;
  // The other programs take no large blocks: not checked.
  EXPECT_TRUE(
      CheckAttentionBackend(AttentionProgram::kMaterialised, {}, DType::kBF16, hs128, kAda).ok());
  EXPECT_TRUE(CheckAttentionBackend(std::nullopt, {}, DType::kF32, hs128, kAda).ok());
  EXPECT_TRUE(CheckAttentionBackend(AttentionProgram::kCudnn, {}, DType::kBF16, hs128, kAda).ok());
  // Every block shape the kernels are built with fits an H100.
  for (const FlashTiles& t : {FlashTiles{}, FlashTiles{128, 128, 32}, FlashTiles{128, 128, 64, 8},
                              FlashTiles{0, 128, 0}}) {
    EXPECT_TRUE(CheckAttentionBackend(std::nullopt, t, DType::kBF16, hs64, kH100).ok());
  }
  for (const FlashTiles& t : {FlashTiles{}, FlashTiles{128, 0, 0, 8}}) {
    EXPECT_TRUE(CheckAttentionBackend(std::nullopt, t, DType::kBF16, hs128, kH100).ok());
  }
}

// The memory model's choice of program (kernels/memory_facts.h, AttentionProgramFor) is the
// kernels' own: CUDA takes the flash program exactly where CheckFlashAttention accepts the shape,
// so the estimator and the model size the same saved tensor and scratch.
TEST(FlashTilesTest, TheMemoryModelChoosesWhatTheKernelsTake) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int hs : {16, 32, 64, 80, 96, 128, 256}) {
      for (const auto& [batch, heads] :
           {std::pair{1, 1}, {8, 12}, {2047, 32}, {2048, 32}, {4096, 16}, {65535, 1}, {65536, 1}}) {
        const bool takes =
            internal::CheckFlashAttention(dtype, {batch, 1024, heads, heads, hs}).ok();
        const AttentionProgram p = AttentionProgramFor(
            KernelBackend::kCuda, static_cast<int64_t>(DTypeSize(dtype)), batch, heads, hs);
        EXPECT_EQ(p == AttentionProgram::kFlash, takes)
            << DTypeName(dtype) << " hs " << hs << " batch " << batch << " heads " << heads;
      }
    }
  }
  EXPECT_EQ(AttentionProgramFor(KernelBackend::kCpu, 4, 1, 1, 16), AttentionProgram::kFlash);
  // A run's request decides on CUDA; the CPU has one program per backend.
  EXPECT_EQ(
      AttentionProgramFor(KernelBackend::kCuda, 2, 8, 12, 64, AttentionProgram::kMaterialised),
      AttentionProgram::kMaterialised);
  EXPECT_EQ(AttentionProgramFor(KernelBackend::kCpu, 2, 8, 12, 64, AttentionProgram::kMaterialised),
            AttentionProgram::kFlash);
  EXPECT_EQ(AttentionBackendNamed(""), std::nullopt);
  EXPECT_EQ(AttentionBackendNamed("flash"), AttentionProgram::kFlash);
  EXPECT_EQ(AttentionBackendNamed("materialised"), AttentionProgram::kMaterialised);
  EXPECT_EQ(AttentionBackendNamed("cudnn"), AttentionProgram::kCudnn);
  EXPECT_EQ(AttentionProgramFor(KernelBackend::kCuda, 2, 8, 12, 64, AttentionProgram::kCudnn),
            AttentionProgram::kCudnn);
  EXPECT_EQ(AttentionProgramFor(KernelBackend::kCpu, 2, 8, 12, 64, AttentionProgram::kCudnn),
            AttentionProgram::kFlash);
  EXPECT_EQ(AttentionSavedBytes(AttentionProgram::kCudnn, 8, 1024, 12, 2), 8 * 12 * 1024 * 4);
  EXPECT_EQ(AttentionProgramFor(KernelBackend::kCpuDouble, 8, 1, 1, 64),
            AttentionProgram::kMaterialised);
  // Flash keeps a log-sum-exp per query and, on CUDA, its backward's fp32 workspace holds D per
  // query and the dQ accumulator (one fp32 per element of out).
  EXPECT_EQ(AttentionSavedBytes(AttentionProgram::kFlash, 8, 1024, 12, 2), 8 * 12 * 1024 * 4);
  EXPECT_EQ(AttentionSavedBytes(AttentionProgram::kMaterialised, 8, 1024, 12, 2),
            int64_t{8} * 12 * 1024 * 1024 * 2);
  EXPECT_EQ(AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kFlash, true, 8, 1024,
                                  768, 12, 12, 2),
            std::vector<int64_t>{(8 * 12 * 1024 + 8 * 1024 * 768) * 4});
  EXPECT_TRUE(AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kFlash, false, 8, 1024,
                                    768, 12, 12, 2)
                  .empty());
}

}  // namespace
}  // namespace zerort::testing
