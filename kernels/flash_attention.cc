// CheckFlashAttention (flash_attention.h): what the CUDA flash kernels take, on any build.
#include "zerort/kernels/flash_attention.h"

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

Status CheckAttentionBackend(std::optional<AttentionProgram> requested, DType dtype,
                             const FlashAttentionShape& shape) {
  if (requested != AttentionProgram::kFlash) return absl::OkStatus();
  const Status s = CheckFlashAttention(dtype, shape);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      StrCat("model.attention_backend = \"flash\": ", s.message(),
             " (unset, the key runs the materialised program where flash does not apply)"));
}

}  // namespace zerort::internal
