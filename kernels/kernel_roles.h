// The roles ModelKernels (model_kernels.h) is made of ([Note: the kernels' roles]): what every
// operation shares (KernelContext), then the operations by what they compute. The contracts
// below hold for every role:
//   - every pointer is memory of the kernels' device; work is issued on the kernels' stream (on
//     an immediate CPU stream: done when the call returns);
//   - element types: activations, weights and their gradients-in-flight in act dtype
//     (act_size() bytes); weight gradients (the shard manager's gradient buffers) in grad dtype
//     (grad_size() bytes); LayerNorm statistics and per-row losses stat_size() bytes (fp32; fp64
//     for double kernels); token ids int32;
//   - backward operations ADD (+=) into every gradient they write, as the shard manager's gradient
//     buffers accumulate across micro-batches, unless a contract says "written"; a null gradient
//     pointer skips that gradient.
//
// [Note: the kernels' roles]
// ModelKernels was one interface of 48 virtual functions; it is now five roles of three to seven
// operations (tokens and loss, norms, linear layers, attention, element-wise), the context they
// share, and the operations that compose roles (ModelKernels' own: a residual add and the norm
// after it, a linear layer with its GELU or residual, each with a default that runs the roles'
// operations one after another and that a backend overrides to fuse them). A backend (the CPU's
// float, 16-bit and double kernels, CUDA's) implements all of them in one class, since its
// operations share its stream, scratch and GEMM handles; a wrapper (ForwardingKernels: the
// stream issue, the census, the timeline) overrides every virtual, defaulted ones included
// (tests/repo/forwarding_test.py). Callers take ModelKernels (a block needs every role); the
// roles are where an operation's contract is read and where a backend's override of it lands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/rope.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort {

// What every operation shares: the device and stream, the element types, host reads, the loss
// ledger and the instrumentation.
class KernelContext {
 public:
  virtual ~KernelContext() = default;

  virtual Device device() const = 0;
  virtual Stream& stream() = 0;
  virtual size_t act_size() const = 0;
  // Whose memory facts these kernels follow ([Note: what the kernels allocate]).
  virtual KernelBackend backend() const = 0;
  virtual size_t grad_size() const = 0;
  virtual size_t stat_size() const = 0;
  // The element types of activations, weight gradients and statistics as collectives and copies
  // name them (tensor parallelism's all-reduces and gathers, the pipeline's boundary sends): the
  // one source of a collective's element type, since fp16 and bf16 have the same size and
  // different bits. nullopt for the double kernels of finite-difference checks: no collective
  // carries fp64, so those kernels run on one rank (CollectiveDType refuses them).
  virtual std::optional<DType> act_dtype() const = 0;
  virtual std::optional<DType> grad_dtype() const = 0;
  virtual std::optional<DType> stat_dtype() const = 0;
  // Copies n activation elements (act dtype) or statistics (stat dtype) to host doubles; waits.
  virtual Status ActToHost(const void* src, int64_t n, double* out) = 0;
  virtual Status StatToHost(const void* src, int64_t n, double* out) = 0;

  // [Note: the training loss ledger]
  // A training step's loss without a host wait per micro-batch. AddToLossLedger adds the mean of
  // n statistics (a micro-batch's per-row losses: their sum / divisor) into a ledger in the
  // stream's order; TakeLossLedger returns the ledger (waiting for the stream once) and zeroes
  // it. This default reads the values at once (StatToHost, which waits on an asynchronous
  // stream) and sums them in double in row order into a host double: the arithmetic of the
  // per-micro-batch loss it replaces, so the step's loss is bitwise the same. The queued CPU
  // kernels run the same on the stream's thread; the CUDA kernels reduce on the device into an
  // fp32 ledger (kernels/reduce.h Sum), so a GPU's loss may differ in the last bits.
  virtual Status AddToLossLedger(const void* src, int64_t n, double divisor) {
    std::vector<double> host(static_cast<size_t>(n));
    ZR_RETURN_IF_ERROR(StatToHost(src, n, host.data()));
    double sum = 0;
    for (double v : host) sum += v;
    loss_ledger_ += sum / divisor;
    return absl::OkStatus();
  }
  virtual StatusOr<double> TakeLossLedger() { return std::exchange(loss_ledger_, 0.0); }

  // Wall seconds spent so far in the linear layers (Matmul, MatmulBackward: their GEMMs and bias)
  // and in the attention (Attention, AttentionBackward), for `zerort bench model --phases`; null
  // where calls return before their work is done (CUDA).
  struct Seconds {
    double matmul = 0;
    double attention = 0;
  };
  virtual const Seconds* seconds() const { return nullptr; }
  // The device work issued so far, by kind (a kernel by its name, "cuBLASLt matmul", "cuBLAS
  // batched GEMM", "memset", "copy to host"): what `zerort bench model --census` differences
  // around a micro-batch for its launch count. A snapshot, made when asked (counting costs a
  // launch one pointer-keyed increment); none where not counted (the CPU kernels, whose
  // operations run as calls).
  virtual std::optional<std::map<std::string, int64_t>> launches() const { return std::nullopt; }

 private:
  double loss_ledger_ = 0;  // the default ledger ([Note: the training loss ledger])
};

// The tokens in and the loss out: the embedding and the softmax cross-entropy, whole or
// vocabulary-parallel.
class TokenKernels {
 public:
  virtual ~TokenKernels() = default;

  // out[b, t] = wte[tokens[b, t] - vocab_begin] + wpe[t]; rows of `channels`. `wte` holds the
  // rows of tokens [vocab_begin, vocab_begin + vocab_count) (all of them without tensor
  // parallelism); a token outside that range contributes zeros (the vocabulary-parallel
  // embedding: the ranks' outputs are summed afterwards). `wpe` null: no position term.
  virtual Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                           int batch, int seq, int channels, int vocab_begin, int vocab_count) = 0;
  // dwte (+=) for the tokens in range, dwpe (+=) for every row; either may be null.
  virtual Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                   int batch, int seq, int channels, int vocab_begin,
                                   int vocab_count) = 0;

  // Softmax cross-entropy per row over its first `valid` columns (the vocabulary; the rest of a
  // row of `vocab` is padding, parallel.make_vocab_size_divisible_by's, never counted; every
  // target below `valid`):
  // losses[r] = -log softmax(logits[r, :valid])[targets[r]] (stat dtype). With `dscale` non-zero,
  // logits are overwritten by their gradient (softmax - onehot(target)) * dscale, 0 on padding,
  // the gradient of dscale x the sum of the losses (the mean over N rows: dscale = loss_scale / N,
  // so that rows can come in chunks): the logits are not needed afterwards, and this saves a
  // [rows, vocab] buffer.
  virtual Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows,
                              int vocab, int valid, float dscale) = 0;
  // Vocabulary-parallel softmax cross-entropy (Megatron), on this rank's columns of the logits,
  // [rows, vocab], global columns [begin, begin + vocab), of which the first `valid` are real
  // vocabulary (the rest is padding, never counted). Per-row values are stat dtype.
  //   VocabMax:    max[r] = max over the valid columns (-inf when there are none)
  //   VocabSums:   sums[r] = sum of exp(logits - gmax[r]) over the valid columns;
  //                sums[rows + r] = logits[r, targets[r] - begin] when that column is here, else 0
  //   VocabCrossEntropyFinish: losses[r] = log(gsums[r]) + gmax[r] - gsums[rows + r]; with dscale
  //                non-zero the logits become their gradient (softmax - onehot) * dscale, 0 on
  //                padding.
  virtual Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) = 0;
  virtual Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                           int64_t rows, int vocab, int valid, int begin) = 0;
  virtual Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax,
                                         const void* gsums, const int32_t* targets, int64_t rows,
                                         int vocab, int valid, int begin, float dscale) = 0;
};

// LayerNorm (GPT-2) and RMSNorm (the LLaMA family, [Note: the two architectures] in
// layers/README.md) over the last dimension.
class NormKernels {
 public:
  virtual ~NormKernels() = default;

  // eps 1e-5 (GPT-2's); mean and rstd are saved for the backward.
  virtual Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                           const void* bias, int64_t rows, int channels) = 0;
  // dinp, dweight and dbias are added to (any may be null); dinp overlaps neither dout nor inp.
  virtual Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                                   const void* inp, const void* weight, const void* mean,
                                   const void* rstd, int64_t rows, int channels) = 0;
  // out = x rstd weight with rstd[r] = 1 / sqrt(mean(x^2) + eps) (stat dtype, saved for the
  // backward).
  virtual Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                         int channels, float eps) = 0;
  // dinp and dweight are added to (either may be null); dinp overlaps neither dout nor inp.
  virtual Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                                 const void* weight, const void* rstd, int64_t rows,
                                 int channels) = 0;
};

// The linear layers' GEMMs, weight [out_features, in] (PyTorch's nn.Linear layout).
class LinearKernels {
 public:
  virtual ~LinearKernels() = default;

  // out[r, o] = inp[r, :] . weight[o, :] + bias[o]  (bias may be null).
  virtual Status Matmul(void* out, const void* inp, const void* weight, const void* bias,
                        int64_t rows, int in, int out_features) = 0;
  virtual Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                                const void* inp, const void* weight, int64_t rows, int in,
                                int out_features) = 0;
  // out[r, c] += bias[c]: a bias added after a reduction (the row-parallel linear's, once).
  virtual Status AddBias(void* out, const void* bias, int64_t rows, int cols) = 0;
};

// Causal self-attention and the rotary embeddings that feed it.
class AttentionKernels {
 public:
  virtual ~AttentionKernels() = default;

  // Causal multi-head self-attention; qkv [batch, seq, (heads + 2 kv_heads) hs] in [Note: the
  // qkv layout] (kernels/model_math.h: a query head reads its group's key/value head in place;
  // GPT-2's kv_heads = heads), out [batch, seq, channels], channels = heads x hs. The backward
  // writes dqkv (the same layout, a key/value head's gradient summed over its query heads; not
  // added to, so no fill before it).
  // `saved` (ModelKernels::AttentionSavedBytes) keeps what the backward needs besides qkv and
  // out: a flash program (the CPU float and 16-bit kernels; CUDA's for bf16/fp16 at head sizes 64
  // and 128) each query's log-sum-exp of its scores (fp32 [batch, heads, seq]; the seq x seq
  // probabilities never exist), a materialised one (the double kernels; CUDA's otherwise) the
  // probabilities (act dtype [batch, heads, seq, seq], zero above the diagonal). Which program
  // runs is attention_program's answer, every backend's own (no default: a wrapper that did not
  // forward it would answer for another program); the sizes are kernels/memory_facts.h's
  // ([Note: what the kernels allocate]).
  virtual AttentionProgram attention_program(int batch, int heads, int head_size) const = 0;
  virtual Status Attention(void* out, void* saved, const void* qkv, int batch, int seq,
                           int channels, int heads, int kv_heads) = 0;
  // `out` is the forward's output.
  virtual Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                   const void* saved, int batch, int seq, int channels, int heads,
                                   int kv_heads) = 0;

  // Rotary position embeddings, into the layout Attention reads: q [rows, heads hs], k and v
  // [rows, kv_heads hs] (rows = batch x seq; a row's position is its index in its sequence) give
  // qkv [rows, (heads + 2 kv_heads) hs] = rope(q), rope(k), v ([Note: the qkv layout]: each
  // key/value head once, read by its g = heads / kv_heads query heads, where Hugging Face's
  // repeat_kv copies it g times). rope is Hugging Face's rotate-half: channel pair (i, i + hs/2) of
  // a head turned by position x inv_freq(i), theta^(-2i / hs) remapped by the rope's scaling
  // (kernels/rope.h).
  virtual Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) = 0;
  // dq, dk, dv (+=) from dqkv (whose key/value heads Attention's backward already summed over
  // their query heads): the rotation's transpose. A null gradient is skipped.
  virtual Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                                 int heads, int kv_heads, int head_size, const Rope& rope) = 0;
  // The same rotation in place: qkv holds the unrotated q, k, v in its layout (one GEMM's output:
  // [Note: a LLaMA block's projections]) and its query and key heads are turned; with `transpose`
  // the rotation's transpose, turning dqkv's back (the backward). The value heads are untouched.
  virtual Status RopeQkvInPlace(void* qkv, int batch, int seq, int heads, int kv_heads,
                                int head_size, const Rope& rope, bool transpose) = 0;
};

// Element-wise operations: the residual connection, the activations, gradient accumulation.
class ElementKernels {
 public:
  virtual ~ElementKernels() = default;

  // out = a + b (the residual connection).
  virtual Status Add(void* out, const void* a, const void* b, int64_t n) = 0;
  // dst += src (the residual's backward; act dtype).
  virtual Status Accumulate(void* dst, const void* src, int64_t n) = 0;
  // dst += src in grad dtype (a weight gradient reduced over the tensor-parallel group, added).
  virtual Status AccumulateGrad(void* dst, const void* src, int64_t n) = 0;
  // GELU, tanh approximation.
  virtual Status Gelu(void* out, const void* inp, int64_t n) = 0;
  virtual Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) = 0;
  // SwiGLU: out [rows, cols] = silu(gate) x up, silu(x) = x sigmoid(x), gate and up side by side
  // in `gate_up`: planar (gate [rows, cols], then up [rows, cols]), or `interleaved` ([rows,
  // 2 cols]: a row's gate, then its up; one GEMM's output, [Note: a LLaMA block's projections]).
  virtual Status SwiGlu(void* out, const void* gate_up, int64_t rows, int cols,
                        bool interleaved) = 0;
  // dgate_up (written, not added to: no fill before it; gate_up's layout) from dout [rows, cols].
  virtual Status SwiGluBackward(void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                                int cols, bool interleaved) = 0;
};

}  // namespace zerort
