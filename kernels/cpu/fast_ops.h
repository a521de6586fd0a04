// The float training path of the GPT model's CPU operations (internal to kernels/cpu): the
// same contracts as model_ops.h, threaded over rows (or attention heads) and vectorised for the
// machine (vector_math.h). model_ops.h's templates call these for float; the double
// instantiation stays the readable reference they are tested against (model_ops_test.cc).
// Results do not depend on the number of OpenMP threads.
#pragma once

#include <cstdint>

#include "zerort/runtime/dtype.h"

namespace zerort::cpu::fast {

// out[r, :] = bias (or 0): the start of MatmulForward.
void FillRows(float* out, const float* bias, int64_t rows, int cols);
// dbias[c] += sum over rows of dout[r, c], in fixed row blocks.
void AddColumnSums(float* dbias, const float* dout, int64_t rows, int cols);

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t rows, int channels, float eps);
// sum = a + b (the residual), out = LayerNorm(sum), one pass over each row; sum may alias a or b.
// Bitwise what Add then LayerNormForward give.
void AddLayerNormForward(float* sum, float* out, float* mean, float* rstd, const float* a,
                         const float* b, const float* weight, const float* bias, int64_t rows,
                         int channels, float eps);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t rows, int channels);

void GeluForward(float* out, const float* inp, int64_t n);
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);
// The MLP's first-layer epilogue after a GEMM without bias: pre[r, :] += bias (null: none), then
// out = gelu(pre), each row once through the cache.
void BiasGelu(float* pre, float* out, const float* bias, int64_t rows, int cols);

void SoftmaxCrossEntropyFused(float* logits, float* losses, const int32_t* targets, int64_t rows,
                              int vocab, int valid, float dscale);

// Causal attention, flash-style: per (batch, head), tiles of 64 queries meet tiles of 64 keys
// up to the diagonal with an online softmax, so neither the masked triangle nor the seq x seq
// probabilities are ever held; `lse` ([batch, heads, seq]) saves each query's log-sum-exp of its
// scaled scores. The backward recomputes each tile's probabilities from q k^T and lse, with
// D = dout . out per query (FlashAttention-2's order). qkv and dqkv in [Note: the qkv layout]
// (kernels/model_math.h): each query head reads its group's key/value head in place. The forward
// is threaded over (batch, query head), the backward over (batch, key/value head), whose query
// heads add into its dK and dV in order; the backward writes dqkv (not added to).
// `products` (kF32, kBF16 or kF16): the element type the probabilities and score gradients are
// rounded to before the products that read them, as the CUDA kernels round them to their tensor
// cores' operands (kernels/flash_tiles.h): the forward's P before P V (the row sums add the
// unrounded P), the backward's P before P^T dout and dS (computed from the unrounded P) before
// dS K and dS^T q. kF32 (the float model) rounds nothing; the 16-bit model kernels pass their
// format, so that the CPU and a GPU run the same method (cuda_parity).
void FlashAttentionForward(float* out, float* lse, const float* qkv, int batch, int seq,
                           int channels, int heads, int kv_heads, DType products = DType::kF32);
void FlashAttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int batch, int seq, int channels, int heads,
                            int kv_heads, DType products = DType::kF32);

// out = a + b; dst += src.
void Add(float* out, const float* a, const float* b, int64_t n);
void Accumulate(float* dst, const float* src, int64_t n);

}  // namespace zerort::cpu::fast
