// zerort's own flash attention on CUDA (issue 48): the block programs of kernels/flash_forward.h
// and kernels/flash_backward.h ([Note: flash attention's block programs]) launched with mma.sync
// tensor-core products on registers, for bf16 and fp16 qkv (fp32 softmax statistics and
// accumulators), head sizes 64 and 128, causal, any sequence length, grouped-query attention
// reading each key/value head in place. The model's CUDA attention in bf16/fp16 at those head
// sizes (kernels/memory_facts.h's AttentionProgramFor), `zerort bench attention --device cuda`
// and the CUDA twin tests call it.
#pragma once

#include <cstdint>
#include <optional>

#include "zerort/kernels/memory_facts.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort::internal {

struct FlashAttentionShape {
  int batch = 0, seq = 0, heads = 0, kv_heads = 0, head_size = 0;
};

// Whether the CUDA flash kernels take this shape and element type; the error names what they
// do not (the element type, the head size, the grouping).
Status CheckFlashAttention(DType dtype, const FlashAttentionShape& shape);

// A run's model.attention_backend on CUDA: `requested` flash must be a shape the kernels take
// (the error names the key and why not); unset (nullopt) and materialised always pass.
Status CheckAttentionBackend(std::optional<AttentionProgram> requested, DType dtype,
                             const FlashAttentionShape& shape);

// out [batch, seq, heads x hs] and lse [batch, heads, seq] (fp32) from qkv ([Note: the qkv
// layout]), on `stream` (CUDA). `block_queries`: the queries a thread block owns, 0 for the
// default (64; [Note: the register-resident forward]), or 64, or 128 at head size 64 (two row
// groups a warp; `bench attention` times it beside the default).
Status CudaFlashAttentionForward(DType dtype, const FlashAttentionShape& shape, void* out,
                                 float* lse, const void* qkv, Stream& stream,
                                 int block_queries = 0);
// dqkv = the gradient of the forward's out for `dout` (written: no fill needed before). `workspace`
// (fp32, 16-byte aligned, of kernels/memory_facts.h's AttentionScratchBytes for the flash backward)
// is scratch the backward fills with D = dout . out ([batch, heads, seq], first) and the fp32 dQ
// accumulator
// ([batch, seq, heads x head size]; [Note: the backward's programs]). `query_chunk`: the
// queries the main program's warps take at a time, 0 for the head size's default
// (kBackwardChunk in kernels/flash_backward.h), or 32 at head size 64; `key_block`: the keys
// a block of the main program owns, 0 for the default (64, 4 warps), or 64, or 128 at head size
// 64 (8 warps). `bench attention` times the others beside the default.
Status CudaFlashAttentionBackward(DType dtype, const FlashAttentionShape& shape, void* dqkv,
                                  float* workspace, const void* dout, const void* qkv,
                                  const void* out, const float* lse, Stream& stream,
                                  int query_chunk = 0, int key_block = 0);

}  // namespace zerort::internal
