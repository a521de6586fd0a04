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

// The block shapes `tiles` asks for, at this head size (the error names the field, its value and
// what the head size takes; kernels/memory_facts.h's FlashTiles says what each one is).
Status CheckFlashTiles(const FlashTiles& tiles, int head_size);

// The shared memory a thread block of the flash programs `tiles` chooses takes at `head_size`
// (64 or 128; tiles checked by CheckFlashTiles): the forward's and the backward's main program's
// (the backward's other two take none). The launches in kernels/cuda/flash_attention.cu pick the
// same programs. At head size 128 the backward takes 105 KiB: more than the 99 KiB a block an
// RTX 4090, L40S or A10 allows (an A100 163, an H100 227).
struct FlashSharedBytes {
  int forward = 0, backward = 0;
};
FlashSharedBytes FlashSharedBytesOf(const FlashTiles& tiles, int head_size);

// A run's model.attention_backend and model.flash_attention on CUDA: `requested` flash must be a
// shape the kernels take, cudnn one CheckCudnnAttention takes (kernels/cudnn_attention.h; whether
// the build has it is CudnnAttentionBuilt's to say), and block shapes other than the defaults
// need the flash program and a head size that takes them (the errors name the key and why not);
// unset (nullopt) and materialised always pass with the default tiles. Where the flash program
// runs (asked for, or unset and chosen) and `shared_memory_per_block` is known (> 0: the
// device's CudaDeviceInfo), its blocks must fit in it; the error names both sizes and the keys
// that choose another program.
Status CheckAttentionBackend(std::optional<AttentionProgram> requested, const FlashTiles& tiles,
                             DType dtype, const FlashAttentionShape& shape,
                             int64_t shared_memory_per_block = 0);

// out [batch, seq, heads x hs] and lse [batch, heads, seq] (fp32) from qkv ([Note: the qkv
// layout]), on `stream` (CUDA), with `tiles.forward_block_queries` queries and
// `tiles.forward_warps` warps a thread block ([Note: the register-resident forward]; the others
// are the backward's).
Status CudaFlashAttentionForward(DType dtype, const FlashAttentionShape& shape, void* out,
                                 float* lse, const void* qkv, Stream& stream,
                                 const FlashTiles& tiles = {});
// dqkv = the gradient of the forward's out for `dout` (written: no fill needed before). `workspace`
// (fp32, 16-byte aligned, of kernels/memory_facts.h's AttentionScratchBytes for the flash backward)
// is scratch the backward fills with D = dout . out ([batch, heads, seq], first) and the fp32 dQ
// accumulator ([batch, seq, heads x head size]; [Note: the backward's programs]). The main
// program's blocks own `tiles.backward_block_keys` keys and its warps take
// `tiles.backward_query_chunk` queries at a time (the forward's field is not read).
Status CudaFlashAttentionBackward(DType dtype, const FlashAttentionShape& shape, void* dqkv,
                                  float* workspace, const void* dout, const void* qkv,
                                  const void* out, const float* lse, Stream& stream,
                                  const FlashTiles& tiles = {});

}  // namespace zerort::internal
