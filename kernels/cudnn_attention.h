// cuDNN's fused flash attention (model.attention_backend "cudnn"; issue 48's optional cuDNN
// path): the forward and backward of the same causal attention zerort's flash kernels run
// (kernels/flash_attention.h), as cuDNN SDPA graphs built through NVIDIA's header-only
// cudnn-frontend, for bf16 and fp16 qkv.
//
// [Note: the cuDNN attention]
// - Built only when CMake is given cudnn-frontend's folder (`-DZR_CUDNN_FRONTEND=DIR`, with CUDA;
//   the frontend is not a Debian package, so CI's builds and `make` leave it out): then
//   kernels/cuda/cudnn_attention.cc compiles, else kernels/cudnn_attention_absent.cc, whose
//   CudnnAttentionBuilt() says why not and whose Create fails the same way.
// - libcudnn is loaded when the first CudnnAttention is made (dlopen of libcudnn.so.9, the
//   frontend's dynamic loading), not linked: a build with the frontend runs wherever one without
//   it runs, and only a run that asks for cuDNN needs the library.
// - The tensors are the model's own, read and written in place through strides, as zerort's flash
//   kernels read them ([Note: the qkv layout]): Q, K and V are views of qkv [batch, seq,
//   (heads + 2 kv_heads) x head size] (grouped-query attention as cuDNN's fewer K/V heads), out is
//   [batch, seq, heads x head size], the saved statistics are the fp32 log-sum-exps [batch, heads,
//   seq] (AttentionSavedBytes: the same bytes as zerort's flash), dqkv is written in qkv's layout.
// - Workspaces: the caller passes kernels/memory_facts.h's AttentionScratchBytes for kCudnn (what
//   the estimator replays); a graph that asks for more fails the call, naming both sizes, rather
//   than allocating what no estimate counted.
// - A graph is built once per shape and element type (building takes cuDNN's heuristics, tens of
//   milliseconds) and kept among the 8 most recently used (kernels/bounded_cache.h; the stream is
//   waited for before one is dropped, so none of its work is still queued). Training needs two to
//   four (each direction, a shorter last batch, evaluation's); generation, a new length each
//   token, builds one a length and drops the oldest: correct, bounded, slow. The backward is
//   cuDNN's non-deterministic one (its dQ is summed by atomics, as zerort's flash backward's is).
// - Results: cuDNN rounds its probabilities and score gradients for its tensor-core products as
//   FlashAttention-2 does, so it agrees with zerort's flash kernels to the 16-bit formats'
//   rounding, not bitwise; flash_attention_cuda_test checks it against the same double reference.
#pragma once

#include <cstdint>
#include <memory>

#include "zerort/kernels/flash_attention.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort::internal {

// OK when this build has the cuDNN attention; else why not (Unimplemented, naming the CMake
// option). Says nothing of whether libcudnn loads here (CudnnAttention::Create does).
Status CudnnAttentionBuilt();

// The shapes the cuDNN path is asked for (bf16/fp16, head sizes multiples of 8 up to 128,
// query heads a multiple of the key/value heads, sequences other than one token); the error names
// what is not.
Status CheckCudnnAttention(DType dtype, const FlashAttentionShape& shape);

class CudnnAttention {
 public:
  // Loads libcudnn and makes a cuDNN handle on the current device, bound to `stream` (CUDA).
  static StatusOr<std::unique_ptr<CudnnAttention>> Create(Stream& stream);
  virtual ~CudnnAttention() = default;

  // out [batch, seq, heads x head size] and lse [batch, heads, seq] from qkv; `workspace` of
  // `workspace_bytes` (AttentionScratchBytes' forward budget).
  virtual Status Forward(DType dtype, const FlashAttentionShape& shape, void* out, float* lse,
                         const void* qkv, void* workspace, int64_t workspace_bytes) = 0;
  // dqkv (written) from dout, qkv, the forward's out and lse; `workspace` of `workspace_bytes`
  // (AttentionScratchBytes' backward budget).
  virtual Status Backward(DType dtype, const FlashAttentionShape& shape, void* dqkv,
                          const void* dout, const void* qkv, const void* out, const float* lse,
                          void* workspace, int64_t workspace_bytes) = 0;
};

}  // namespace zerort::internal
