// CheckFlashAttention, CheckFlashTiles, CheckAttentionBackend (flash_attention.h) and
// CheckCudnnAttention (cudnn_attention.h): what the CUDA attention programs take, on any build.
#include "zerort/kernels/flash_attention.h"

#include <algorithm>

#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/flash_backward.h"
#include "zerort/kernels/flash_forward.h"
#include "zerort/runtime/strings.h"

namespace zerort::internal {

Status CheckFlashAttention(DType dtype, const FlashAttentionShape& s) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(StrCat("flash attention on CUDA takes bf16 or fp16, not ",
                                             DTypeName(dtype),
                                             " (fp32 attention runs the materialised kernels)"));
  }
  if (s.head_size != 64 && s.head_size != 128) {
    return absl::InvalidArgumentError(
        StrCat("flash attention on CUDA takes head sizes 64 and 128, not ", s.head_size));
  }
  if (s.batch < 0 || s.seq < 0 || s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(StrCat("flash attention: batch ", s.batch, ", seq ", s.seq,
                                             ", ", s.heads, " query heads over ", s.kv_heads,
                                             " key/value heads is not an attention shape"));
  }
  if (int64_t{s.batch} * s.heads > 65535) {  // the 2-D grids' y dimension
    return absl::InvalidArgumentError(StrCat(
        "flash attention on CUDA: batch x heads = ", int64_t{s.batch} * s.heads, " is over 65535"));
  }
  // The 1-D grids ([Note: the longest blocks first]): a block per 64-query tile of each head
  // within 2^31 - 1. Only a sequence of millions reaches it (its fp32 log-sum-exps alone would
  // be over 500 GB); AttentionProgramFor, which has no sequence, does not check it.
  const int64_t blocks = int64_t{s.batch} * s.heads * ((int64_t{s.seq} + 63) / 64);
  if (blocks > 2147483647) {
    return absl::InvalidArgumentError(
        StrCat("flash attention on CUDA: ", blocks, " blocks of 64 queries is over 2^31 - 1"));
  }
  return absl::OkStatus();
}

// The defaults are among the block shapes built at every head size (flash_attention.cu's
// dispatch builds 64-query forwards and 64-key backwards everywhere, 32-query chunks at 128).
static_assert(flash::kForwardGroups<128> == 1 && flash::kBackwardWarps<128> == flash::kWarps &&
              flash::kBackwardChunk<128> == 32);
static_assert(flash::ForwardBlockFor(64, 0, 0).warps != 0 &&
              flash::ForwardBlockFor(128, 0, 0).warps != 0);
static_assert(flash::kBackwardWarps<64> == 4 || flash::kBackwardWarps<64> == 8);
static_assert(flash::kBackwardChunk<64> == 32 || flash::kBackwardChunk<64> == 64);

Status CheckFlashTiles(const FlashTiles& t, int head_size) {
  // Each field's values built at head size 64 and at 128 besides 0, the default's (a second
  // value of 0: none). 128-query forward blocks and 8-warp ones exist at both ([Note: the
  // register-resident forward]); the backward's other shapes at 64 only.
  const bool hs64 = head_size == 64;
  struct Field {
    const char* name;
    int value;
    int at64[2], at128[2];
  };
  for (const Field& f :
       {Field{"forward_block_queries", t.forward_block_queries, {64, 128}, {64, 128}},
        Field{"forward_warps", t.forward_warps, {4, 8}, {4, 8}},
        Field{"backward_block_keys", t.backward_block_keys, {64, 128}, {64, 0}},
        Field{"backward_query_chunk", t.backward_query_chunk, {32, 64}, {32, 0}}}) {
    const int* ok = hs64 ? f.at64 : f.at128;
    if (f.value == 0 || f.value == ok[0] || f.value == ok[1]) continue;
    return absl::InvalidArgumentError(StrCat(f.name, " = ", f.value, " at head size ", head_size,
                                             " (0: the default, or ", ok[0],
                                             ok[1] != 0 ? StrCat(" or ", ok[1]) : "", ")"));
  }
  if (flash::ForwardBlockFor(head_size, t.forward_block_queries, t.forward_warps).warps == 0) {
    return absl::InvalidArgumentError(
        StrCat("forward_block_queries = ", t.forward_block_queries,
               " with forward_warps = ", t.forward_warps, " at head size ", head_size,
               " (a forward block is 64 queries on 4 warps, or 128 on 8", hs64 ? " or on 4" : "",
               "; 0 takes the other field's match)"));
  }
  return absl::OkStatus();
}

namespace {

// The launches' choices (kernels/cuda/flash_attention.cu's Forward and Backward dispatch).
template <int D>
int ForwardSharedBytes(const flash::ForwardBlock& b) {
  if (b.warps == 8) return flash::ForwardSmem<D, 1, 8>::bytes;
  if constexpr (D == 64) {
    if (b.groups == 2) return flash::ForwardSmem<D, 2>::bytes;
  }
  return flash::ForwardSmem<D, 1>::bytes;
}
template <int D>
int BackwardSharedBytes(int block_keys) {
  return flash::BackwardBlockKeys<D>(block_keys) == 128 ? flash::BackwardSmem<D, 128>::bytes
                                                        : flash::BackwardSmem<D, 64>::bytes;
}

}  // namespace

FlashSharedBytes FlashSharedBytesOf(const FlashTiles& t, int head_size) {
  const flash::ForwardBlock block =
      flash::ForwardBlockFor(head_size, t.forward_block_queries, t.forward_warps);
  if (head_size == 64) {
    return {ForwardSharedBytes<64>(block), BackwardSharedBytes<64>(t.backward_block_keys)};
  }
  return {ForwardSharedBytes<128>(block), BackwardSharedBytes<128>(t.backward_block_keys)};
}

Status CheckCudnnAttention(DType dtype, const FlashAttentionShape& s) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        StrCat("cuDNN's flash attention takes bf16 or fp16, not ", DTypeName(dtype)));
  }
  if (s.head_size < 8 || s.head_size > 128 || s.head_size % 8 != 0) {
    return absl::InvalidArgumentError(StrCat(
        "cuDNN's flash attention is used at head sizes that are multiples of 8 up to 128, not ",
        s.head_size));
  }
  if (s.batch < 0 || s.seq < 0 || s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(StrCat("cuDNN attention: batch ", s.batch, ", seq ", s.seq,
                                             ", ", s.heads, " query heads over ", s.kv_heads,
                                             " key/value heads is not an attention shape"));
  }
  // cuDNN 9's backward graph says "s_q = s_kv = 1 is not supported" (H200, 2026-12-04).
  if (s.seq == 1) {
    return absl::InvalidArgumentError(
        "cuDNN's flash attention does not take sequences of one token (its backward graph refuses "
        "s_q = s_kv = 1); model.attention_backend flash or materialised does");
  }
  return absl::OkStatus();
}

namespace {

bool Fits(const FlashSharedBytes& need, int64_t limit) {
  return need.forward <= limit && need.backward <= limit;
}

// The flash program's blocks against the device's shared memory a block; the error suggests
// model.flash_attention's defaults where those would fit.
Status CheckFlashFits(const FlashTiles& tiles, int head_size, int64_t limit) {
  const FlashSharedBytes need = FlashSharedBytesOf(tiles, head_size);
  if (Fits(need, limit)) return absl::OkStatus();
  const bool forward = need.forward > limit;
  return absl::InvalidArgumentError(
      StrCat("zerort's flash attention at head size ", head_size, " takes ",
             forward ? need.forward : need.backward, " bytes of shared memory a block in its ",
             forward ? "forward" : "backward",
             tiles == FlashTiles{} ? "" : " (model.flash_attention)", ", more than the ", limit,
             " this GPU allows: set model.attention_backend to "
             "\"materialised\"",
             CudnnAttentionBuilt().ok() ? " or \"cudnn\"" : "",
             tiles != FlashTiles{} && Fits(FlashSharedBytesOf({}, head_size), limit)
                 ? ", or model.flash_attention's defaults"
                 : ""));
}

}  // namespace

Status CheckAttentionBackend(std::optional<AttentionProgram> requested, const FlashTiles& tiles,
                             DType dtype, const FlashAttentionShape& shape,
                             int64_t shared_memory_per_block) {
  if (requested == AttentionProgram::kCudnn) {
    const Status s = CheckCudnnAttention(dtype, shape);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          StrCat("model.attention_backend = \"cudnn\": ", s.message()));
    }
  }
  if (requested == AttentionProgram::kFlash) {
    const Status s = CheckFlashAttention(dtype, shape);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          StrCat("model.attention_backend = \"flash\": ", s.message(),
                 " (unset, the key runs the materialised program where flash does not apply)"));
    }
  }
  const bool flash =
      AttentionProgramFor(KernelBackend::kCuda, static_cast<int64_t>(DTypeSize(dtype)), shape.batch,
                          shape.heads, shape.head_size, requested) == AttentionProgram::kFlash;
  const bool known = shared_memory_per_block > 0;
  if (tiles == FlashTiles{}) {
    if (!flash || !known) return absl::OkStatus();
    return CheckFlashFits(tiles, shape.head_size, shared_memory_per_block);
  }
  if (!flash) {
    if (requested == AttentionProgram::kCudnn) {
      return absl::InvalidArgumentError(
          "model.flash_attention is set, but model.attention_backend = \"cudnn\" runs cuDNN's "
          "attention: the block shapes are zerort's flash kernels'");
    }
    return absl::InvalidArgumentError(
        StrCat("model.flash_attention is set, but this run's attention is the materialised "
               "program (",
               requested.has_value() ? "model.attention_backend = \"materialised\""
                                     : CheckFlashAttention(dtype, shape).message(),
               "): the block shapes are the flash kernels'"));
  }
  const Status s = CheckFlashTiles(tiles, shape.head_size);
  if (!s.ok()) return absl::InvalidArgumentError(StrCat("model.flash_attention.", s.message()));
  if (!known) return absl::OkStatus();
  return CheckFlashFits(tiles, shape.head_size, shared_memory_per_block);
}

}  // namespace zerort::internal
