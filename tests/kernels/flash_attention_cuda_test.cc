// zerort's CUDA flash attention (kernels/flash_attention.h) on the GPU (gpu label; skipped with
// the reason when no GPU is present): the cases flash_tiles_test.cc runs through the CPU
// executor, here through the CUDA kernels (the PTX warp instructions, real lanes and warps),
// against the same double reference and tolerances; shapes the kernels do not take are refused by
// name. cuDNN's attention (model.attention_backend "cudnn") against the same reference, where the
// build has it and libcudnn loads.
#include <optional>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/kernels/flash_harness.h"
#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/runtime/allocator.h"

namespace zerort::testing {
namespace {

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

struct Gpu {
  Device device = Device::Cuda(0);
  std::unique_ptr<Allocator> allocator = *MakeCudaCachingAllocator(device, nullptr);
  std::unique_ptr<Stream> stream = *CreateStream(device, "compute");
  std::vector<Buffer> buffers;

  void* Alloc(size_t bytes) {
    buffers.push_back(*allocator->Allocate(bytes, MemoryCategory::kWorkspace, stream.get()));
    return buffers.back().data();
  }
  template <typename T>
  void* Up(const std::vector<T>& host) {
    void* d = Alloc(host.size() * sizeof(T));
    EXPECT_TRUE(
        CopyBytes(d, device, host.data(), Device::Cpu(), host.size() * sizeof(T), nullptr).ok());
    return d;
  }
  template <typename T>
  void Down(std::vector<T>* host, const void* d) {
    ASSERT_TRUE(stream->Synchronize().ok());
    ASSERT_TRUE(
        CopyBytes(host->data(), Device::Cpu(), d, device, host->size() * sizeof(T), nullptr).ok());
  }
};

// At head size 64 every program: the forward's 64-query blocks (the default) and 128 (two row
// groups on 4 warps, one on 8), the backward's query chunks 64 (the default) and 32, at 64 keys
// a block (4 warps, the default) and 128 (8 warps): the defaults, then the others (FlashTiles:
// forward queries, backward keys, backward query chunk, forward warps). At head size 128 the
// forward's 64 and 128 queries (8 warps). Every forward block shape gives the default's outputs
// and log-sum-exps bit for bit (a warp's queries meet the same key tiles through the same
// instructions, [Note: the register-resident forward]).
TEST(FlashAttentionCudaTest, ForwardAndBackwardAgainstTheDoubleReference) {
  ZR_NEED_GPU();
  for (const FlashCase& c : FlashCases()) {
    std::optional<FlashOutputs> first;  // the defaults' run
    const std::vector<FlashTiles> variants = c.hs == 64
                                                 ? std::vector<FlashTiles>{{0, 0, 0},
                                                                           {128, 0, 32},
                                                                           {0, 128, 64},
                                                                           {128, 128, 32},
                                                                           {128, 0, 0, 8}}
                                                 : std::vector<FlashTiles>{{0, 0, 0}, {128, 0, 0}};
    for (const FlashTiles& tiles : variants) {
      SCOPED_TRACE(::testing::Message() << "forward_block_queries " << tiles.forward_block_queries
                                        << ", backward_block_keys " << tiles.backward_block_keys
                                        << ", backward_query_chunk " << tiles.backward_query_chunk);
      const FlashInputs in = MakeFlashInputs(c);
      Gpu g;
      const DType dtype = c.bf16 ? DType::kBF16 : DType::kF16;
      const internal::FlashAttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, c.hs};
      FlashOutputs got{.out = std::vector<uint16_t>(in.out_size()), .dqkv = in.dqkv};
      got.lse.assign(in.stat_size(), 0.0f);
      got.dvec.assign(in.stat_size(), 0.0f);
      const void* qkv = g.Up(in.qkv);
      const void* dout = g.Up(in.dout);
      void* dqkv = g.Up(in.dqkv);
      void* out = g.Alloc(got.out.size() * 2);
      auto* lse = static_cast<float*>(g.Alloc(got.lse.size() * 4));
      // The backward's workspace: D first, then the dQ accumulator from the next 16-byte
      // boundary (kernels/memory_facts.h; case {1, 1, 3} puts it 12 bytes past D's end).
      const int64_t workspace_bytes =
          AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kFlash, true, c.batch,
                                c.seq, c.heads * c.hs, c.heads, c.kv_heads, 2)
              .at(0);
      EXPECT_EQ(workspace_bytes, ((in.stat_size() + 3) / 4 * 4 + in.out_size()) * 4);
      auto* workspace = static_cast<float*>(g.Alloc(workspace_bytes));
      ASSERT_TRUE(
          internal::CudaFlashAttentionForward(dtype, shape, out, lse, qkv, *g.stream, tiles).ok());
      ASSERT_TRUE(internal::CudaFlashAttentionBackward(dtype, shape, dqkv, workspace, dout, qkv,
                                                       out, lse, *g.stream, tiles)
                      .ok());
      g.Down(&got.out, out);
      g.Down(&got.dqkv, dqkv);
      g.Down(&got.lse, lse);
      g.Down(&got.dvec, workspace);  // D, the workspace's first part
      ExpectFlashMatchesReference(in, got);
      if (!first) {
        first = got;
      } else {
        EXPECT_EQ(got.out, first->out) << "a forward block shape's outputs are not the default's";
        EXPECT_EQ(got.lse, first->lse) << "nor its log-sum-exps";
      }
    }
  }
}

// cuDNN's SDPA graphs on the same cases, through the workspaces the memory plan gives them
// (kernels/memory_facts.h), dqkv starting as the harness's poison: every element written.
TEST(FlashAttentionCudaTest, CudnnAgainstTheDoubleReference) {
  ZR_NEED_GPU();
  if (const Status built = internal::CudnnAttentionBuilt(); !built.ok()) {
    GTEST_SKIP() << built.message();
  }
  Gpu g;
  StatusOr<std::unique_ptr<internal::CudnnAttention>> made =
      internal::CudnnAttention::Create(*g.stream);
  if (!made.ok() && made.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << made.status().message();  // libcudnn 9 not on this machine
  }
  ASSERT_TRUE(made.ok()) << made.status();
  internal::CudnnAttention& cudnn = **made;
  for (const FlashCase& c : FlashCases()) {
    const FlashInputs in = MakeFlashInputs(c);
    const DType dtype = c.bf16 ? DType::kBF16 : DType::kF16;
    const internal::FlashAttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, c.hs};
    if (c.seq == 1) {  // cuDNN's backward refuses it; refused by name before any graph is built
      const Status one = cudnn.Forward(dtype, shape, nullptr, nullptr, nullptr, nullptr, 0);
      EXPECT_NE(one.message().find("sequences of one token"), std::string_view::npos) << one;
      continue;
    }
    FlashOutputs got{.out = std::vector<uint16_t>(in.out_size()), .dqkv = in.dqkv};
    got.lse.assign(in.stat_size(), 0.0f);
    const void* qkv = g.Up(in.qkv);
    const void* dout = g.Up(in.dout);
    void* dqkv = g.Up(in.dqkv);
    void* out = g.Alloc(got.out.size() * 2);
    auto* lse = static_cast<float*>(g.Alloc(got.lse.size() * 4));
    auto budget = [&](bool backward) {
      return AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kCudnn, backward,
                                   c.batch, c.seq, c.heads * c.hs, c.heads, c.kv_heads, 2)
          .at(0);
    };
    const int64_t fwd = budget(false), bwd = budget(true);
    void* fwd_ws = g.Alloc(fwd);
    void* bwd_ws = g.Alloc(bwd);
    const Status forward = cudnn.Forward(dtype, shape, out, lse, qkv, fwd_ws, fwd);
    ASSERT_TRUE(forward.ok()) << forward;
    const Status backward = cudnn.Backward(dtype, shape, dqkv, dout, qkv, out, lse, bwd_ws, bwd);
    ASSERT_TRUE(backward.ok()) << backward;
    g.Down(&got.out, out);
    g.Down(&got.dqkv, dqkv);
    g.Down(&got.lse, lse);
    ExpectFlashMatchesReference(in, got, 1e-4);
  }
  // What it does not take, by name, before any graph is built.
  const Status fp32 =
      cudnn.Forward(DType::kF32, {1, 8, 2, 2, 64}, nullptr, nullptr, nullptr, nullptr, 0);
  EXPECT_EQ(fp32.code(), absl::StatusCode::kInvalidArgument) << fp32;
  const Status hs =
      cudnn.Forward(DType::kBF16, {1, 8, 2, 2, 160}, nullptr, nullptr, nullptr, nullptr, 0);
  EXPECT_NE(hs.message().find("160"), std::string_view::npos) << hs;
}

TEST(FlashAttentionCudaTest, RefusesWhatItDoesNotTake) {
  ZR_NEED_GPU();
  Gpu g;
  const Status fp32 = internal::CudaFlashAttentionForward(DType::kF32, {1, 8, 2, 2, 64}, nullptr,
                                                          nullptr, nullptr, *g.stream);
  EXPECT_EQ(fp32.code(), absl::StatusCode::kInvalidArgument) << fp32;
  const Status hs = internal::CudaFlashAttentionForward(DType::kBF16, {1, 8, 2, 2, 80}, nullptr,
                                                        nullptr, nullptr, *g.stream);
  EXPECT_NE(hs.message().find("80"), std::string_view::npos) << hs;
  const Status rows = internal::CudaFlashAttentionForward(DType::kBF16, {1, 8, 2, 2, 128}, nullptr,
                                                          nullptr, nullptr, *g.stream, {96, 0, 0});
  EXPECT_EQ(rows.code(), absl::StatusCode::kInvalidArgument) << rows;
  EXPECT_NE(rows.message().find("forward_block_queries = 96 at head size 128"),
            std::string_view::npos)
      << rows;
  for (const auto& [hs, chunk] : {std::pair{128, 64}, std::pair{64, 48}}) {
    const Status chunked = internal::CudaFlashAttentionBackward(
        DType::kBF16, {1, 8, 2, 2, hs}, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        *g.stream, {0, 0, chunk});
    EXPECT_EQ(chunked.code(), absl::StatusCode::kInvalidArgument) << chunked;
    EXPECT_NE(chunked.message().find("backward_query_chunk = " + std::to_string(chunk)),
              std::string_view::npos)
        << chunked;
  }
  const Status keys = internal::CudaFlashAttentionBackward(DType::kBF16, {1, 8, 2, 2, 128}, nullptr,
                                                           nullptr, nullptr, nullptr, nullptr,
                                                           nullptr, *g.stream, {0, 128, 0});
  EXPECT_EQ(keys.code(), absl::StatusCode::kInvalidArgument) << keys;
  EXPECT_NE(keys.message().find("backward_block_keys = 128"), std::string_view::npos) << keys;
}

}  // namespace
}  // namespace zerort::testing
