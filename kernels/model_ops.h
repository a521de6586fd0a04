// CPU operations of the GPT model (forward and backward), the readable reference the CUDA
// twins will be tested against. Templated on the element type: float for training, double for
// the finite-difference gradient checks. Row-major. Backward functions ADD (+=) into every
// gradient, weight and input alike, as the shard manager's gradient buffers accumulate; a null
// gradient pointer skips that gradient. Token ids are int32.
#pragma once

#include <cstdint>

#include "zerort/kernels/rope.h"

namespace zerort::cpu {

// out[r, o] = sum_i inp[r, i] * weight[o, i] + bias[o]   (weight is [out_features, in]; bias
// may be null). GEMMs through OpenBLAS.
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t rows, int in,
                   int out_features);
template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t rows, int in, int out_features);

// y = (x - mean) * rstd * weight + bias over the last dimension C; mean and rstd ([rows]) are
// saved for the backward. eps is GPT-2's.
inline constexpr double kLayerNormEps = 1e-5;
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t rows, int channels, T eps = T(kLayerNormEps));
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t rows, int channels);

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);

// probs = softmax(logits) per row; returns the mean over rows of -log probs[target].
template <typename T>
T SoftmaxCrossEntropyForward(T* probs, const T* logits, const int32_t* targets, int64_t rows,
                             int vocab);
// dlogits += (probs - onehot(target)) * dloss / rows: the gradient of dloss x mean loss.
template <typename T>
void SoftmaxCrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, int64_t rows,
                                 int vocab, T dloss);

// Per-row losses[r] = -log softmax(logits[r, :valid])[targets[r]] (a row of `vocab`, the columns
// from `valid` on padding). With dscale != 0, logits are replaced in place by (softmax -
// onehot(target)) * dscale, 0 on padding, the gradient of dscale x the sum of the losses (the
// fused classifier of the model).
template <typename T>
void SoftmaxCrossEntropyFused(T* logits, T* losses, const int32_t* targets, int64_t rows, int vocab,
                              int valid, T dscale);

// Causal multi-head self-attention. qkv is [batch, seq, (heads + 2 kv_heads) hs] ([Note: the qkv
// layout], kernels/model_math.h: query heads, then key heads, then value heads, hs = channels /
// heads); out is [batch, seq, channels]; att ([batch, heads, seq, seq]) saves the softmax
// probabilities for the backward (zero above the diagonal). Scores are scaled by
// 1 / sqrt(head size). The backward writes dqkv (the same layout).
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int batch, int seq, int channels, int heads,
                      int kv_heads);
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int batch, int seq,
                       int channels, int heads, int kv_heads);

// out[b, t] = wte[tokens[b, t] - begin] + wpe[t]  for b < batch, t < seq, each a row of
// `channels`; a token outside [begin, begin + count) gives zeros, a null wpe no position term.
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int batch, int seq,
                      int channels, int begin, int count);
template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int batch, int seq,
                       int channels, int begin, int count);

// ---- The LLaMA family's operations (llama_ops.cc; ModelKernels documents each) ----------------

// RMSNorm: out = x rstd weight, rstd[r] = 1 / sqrt(mean(x^2) + eps) (saved for the backward).
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t rows, int channels,
                    T eps);
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int64_t rows, int channels);
// Rotary embeddings (rotate-half) on q and k: q [rows, heads hs], k and v [rows, kv_heads hs]
// into qkv [rows, (heads + 2 kv_heads) hs] ([Note: the qkv layout]); the backward adds the
// rotation's transpose into dq, dk and dv.
template <typename T>
void RopeQkvForward(T* qkv, const T* q, const T* k, const T* v, int batch, int seq, int heads,
                    int kv_heads, int head_size, const Rope& rope);
template <typename T>
void RopeQkvBackward(T* dq, T* dk, T* dv, const T* dqkv, int batch, int seq, int heads,
                     int kv_heads, int head_size, const Rope& rope);
// The same rotation in place on qkv's query and key heads (the value heads untouched); with
// `transpose` the rotation's transpose (the backward, on dqkv). Bitwise what the two above compute.
template <typename T>
void RopeQkvInPlace(T* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                    const Rope& rope, bool transpose);
// SwiGLU: out = silu(gate) up.
// gate and up side by side in gate_up: planar, or interleaved per row (ModelKernels::SwiGlu).
template <typename T>
void SwiGluForward(T* out, const T* gate_up, int64_t rows, int cols, bool interleaved);
template <typename T>
void SwiGluBackward(T* dgate_up, const T* dout, const T* gate_up, int64_t rows, int cols,
                    bool interleaved);

}  // namespace zerort::cpu
