// ForwardingKernels: a ModelKernels that runs each operation of an inner one through a hook, the
// one place a wrapper says what it does around every call (internal to kernels/). `Hook` provides
//   Status Op(const OpInfo& info, Work&& w)   every operation: run or issue `w`;
//   R HostRead(const char* name, Read&& read)  the calls that bring values to the host
//                                              (ActToHost, StatToHost, TakeLossLedger);
//   Stream& stream(ModelKernels& inner)        the stream the wrapper says it runs on;
//   void Finish()                              when the wrapper is destroyed.
// The CPU kernels issued on a stream (cpu/stream_kernels.cc) and the census of operations and host
// reads (op_census.cc) are the two hooks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "zerort/kernels/model_kernels.h"

namespace zerort::internal {

// What a hook is told of an operation: its name and, for the GEMMs and the attention, the work
// it does, for the others the memory they move (`zerort bench model --timeline` reports FLOP/s
// and GB/s).
struct OpInfo {
  const char* name;
  double flops = 0;       // multiply-adds x 2; 0 where not counted (element-wise work)
  int64_t shape[3] = {};  // GEMMs: rows, in, out; attention: batch, seq, channels
  // [Note: an operation's bytes]
  // The memory traffic ModelKernels' contract implies for the memory-bound operations: each
  // input read once, each output written once, each gradient it adds into (+=) read and written
  // once, in the element sizes of model_kernels.h (act_size, grad_size, stat_size; token ids 4
  // bytes). A floor, not a count of what a kernel does: a kernel that reads a row twice, or a
  // scratch buffer's fill, moves more, and the timeline's GB/s against the device's bandwidth says
  // how much. 0 for the GEMMs and the attention (bound by their FLOPs) and the loss ledger.
  double bytes = 0;

  // One GEMM [rows, in] x [in, out] per product computed (a backward computes one or two).
  static OpInfo Gemm(const char* name, int64_t rows, int in, int out, int products) {
    return {name, 2.0 * static_cast<double>(rows) * in * out * products, {rows, in, out}};
  }
  // Causal attention by FlashAttention's count: 4 B T^2 C / 2 forward (QK^T and PV, half the
  // square), the backward `factor` 2.5 times that.
  static OpInfo CausalAttention(const char* name, int batch, int seq, int channels, double factor) {
    return {name,
            factor * 2.0 * batch * static_cast<double>(seq) * seq * channels,
            {batch, seq, channels}};
  }
  // A memory-bound operation moving `bytes` ([Note: an operation's bytes]).
  static OpInfo Traffic(const char* name, double bytes) { return {name, 0, {}, bytes}; }
};

template <typename Hook>
class ForwardingKernels final : public ModelKernels {
 public:
  ForwardingKernels(std::unique_ptr<ModelKernels> inner, Hook hook)
      : k_(std::move(inner)),
        hook_(std::move(hook)),
        a_(static_cast<double>(k_->act_size())),
        g_(static_cast<double>(k_->grad_size())),
        st_(static_cast<double>(k_->stat_size())) {}
  ~ForwardingKernels() override { hook_.Finish(); }

  Device device() const override { return k_->device(); }
  Stream& stream() override { return hook_.stream(*k_); }
  size_t act_size() const override { return k_->act_size(); }
  KernelBackend backend() const override { return k_->backend(); }
  AttentionProgram attention_program(int batch, int heads, int head_size) const override {
    return k_->attention_program(batch, heads, head_size);  // model.attention_backend's
  }
  size_t grad_size() const override { return k_->grad_size(); }
  size_t stat_size() const override { return k_->stat_size(); }
  std::optional<DType> act_dtype() const override { return k_->act_dtype(); }
  std::optional<DType> grad_dtype() const override { return k_->grad_dtype(); }
  std::optional<DType> stat_dtype() const override { return k_->stat_dtype(); }
  const Seconds* seconds() const override { return k_->seconds(); }
  std::optional<std::map<std::string, int64_t>> launches() const override { return k_->launches(); }

  Status ActToHost(const void* src, int64_t n, double* out) override {
    return hook_.HostRead("ActToHost", [&] { return k_->ActToHost(src, n, out); });
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    return hook_.HostRead("StatToHost", [&] { return k_->StatToHost(src, n, out); });
  }
  Status AddToLossLedger(const void* src, int64_t n, double divisor) override {
    return hook_.Op(OpInfo{"AddToLossLedger"},
                    [=, this] { return k_->AddToLossLedger(src, n, divisor); });
  }
  StatusOr<double> TakeLossLedger() override {
    return hook_.HostRead("TakeLossLedger", [&] { return k_->TakeLossLedger(); });
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    return hook_.Op(OpInfo::Traffic("Embedding", EmbeddingBytes(batch, seq, channels, vocab_count,
                                                                wpe != nullptr, a_)),
                    [=, this] {
                      return k_->Embedding(out, tokens, wte, wpe, batch, seq, channels, vocab_begin,
                                           vocab_count);
                    });
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    return hook_.Op(
        OpInfo::Traffic("EmbeddingBackward",
                        EmbeddingBytes(batch, seq, channels, dwte != nullptr ? vocab_count : 0,
                                       dwpe != nullptr, 2 * g_)),
        [=, this] {
          return k_->EmbeddingBackward(dwte, dwpe, dout, tokens, batch, seq, channels, vocab_begin,
                                       vocab_count);
        });
  }
  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    return hook_.Op(OpInfo::Traffic("LayerNorm", NormBytes(rows, channels, 2, 2, 2)), [=, this] {
      return k_->LayerNorm(out, mean, rstd, inp, weight, bias, rows, channels);
    });
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    return hook_.Op(
        OpInfo::Traffic("LayerNormBackward",
                        NormBytes(rows, channels, dinp != nullptr ? 4 : 2, 1, 2) +
                            2 * g_ * channels * ((dweight != nullptr) + (dbias != nullptr))),
        [=, this] {
          return k_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows,
                                       channels);
        });
  }
  Status AddLayerNorm(void* sum, void* out, void* mean, void* rstd, const void* a, const void* b,
                      const void* weight, const void* bias, int64_t rows, int channels) override {
    return hook_.Op(OpInfo::Traffic("AddLayerNorm", NormBytes(rows, channels, 4, 2, 2)), [=, this] {
      return k_->AddLayerNorm(sum, out, mean, rstd, a, b, weight, bias, rows, channels);
    });
  }
  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    return hook_.Op(OpInfo::Gemm("Matmul", rows, in, out_features, 1), [=, this] {
      return k_->Matmul(out, inp, weight, bias, rows, in, out_features);
    });
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    return hook_.Op(OpInfo::Gemm("MatmulBackward", rows, in, out_features,
                                 (dinp != nullptr) + (dweight != nullptr)),
                    [=, this] {
                      return k_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, rows, in,
                                                out_features);
                    });
  }
  // Counted and timed as a MatmulBackward: the same GEMMs, its input gradient written.
  Status MatmulBackwardWrite(void* dinp, void* dweight, void* dbias, const void* dout,
                             const void* inp, const void* weight, int64_t rows, int in,
                             int out_features) override {
    return hook_.Op(OpInfo::Gemm("MatmulBackward", rows, in, out_features,
                                 (dinp != nullptr) + (dweight != nullptr)),
                    [=, this] {
                      return k_->MatmulBackwardWrite(dinp, dweight, dbias, dout, inp, weight, rows,
                                                     in, out_features);
                    });
  }
  Status GeluMatmulBackward(void* dpre, void* dweight, void* dbias, const void* dout,
                            const void* act, const void* pre, const void* weight, void* scratch,
                            int64_t rows, int in, int out_features) override {
    return hook_.Op(OpInfo::Gemm("GeluMatmulBackward", rows, in, out_features,
                                 (dpre != nullptr) + (dweight != nullptr)),
                    [=, this] {
                      return k_->GeluMatmulBackward(dpre, dweight, dbias, dout, act, pre, weight,
                                                    scratch, rows, in, out_features);
                    });
  }
  Status MatmulResidual(void* out, const void* inp, const void* weight, const void* bias,
                        const void* residual, int64_t rows, int in, int out_features) override {
    return hook_.Op(OpInfo::Gemm("MatmulResidual", rows, in, out_features, 1), [=, this] {
      return k_->MatmulResidual(out, inp, weight, bias, residual, rows, in, out_features);
    });
  }
  Status MatmulGelu(void* pre, void* out, const void* inp, const void* weight, const void* bias,
                    int64_t rows, int in, int out_features) override {
    return hook_.Op(OpInfo::Gemm("MatmulGelu", rows, in, out_features, 1), [=, this] {
      return k_->MatmulGelu(pre, out, inp, weight, bias, rows, in, out_features);
    });
  }
  Status Attention(void* out, void* saved, const void* qkv, int batch, int seq, int channels,
                   int heads, int kv_heads) override {
    return hook_.Op(OpInfo::CausalAttention("Attention", batch, seq, channels, 1.0), [=, this] {
      return k_->Attention(out, saved, qkv, batch, seq, channels, heads, kv_heads);
    });
  }
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const void* saved, int batch, int seq, int channels, int heads,
                           int kv_heads) override {
    return hook_.Op(OpInfo::CausalAttention("AttentionBackward", batch, seq, channels, 2.5),
                    [=, this] {
                      return k_->AttentionBackward(dqkv, dout, qkv, out, saved, batch, seq,
                                                   channels, heads, kv_heads);
                    });
  }
  Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                 int channels, float eps) override {
    return hook_.Op(OpInfo::Traffic("RmsNorm", NormBytes(rows, channels, 2, 1, 1)),
                    [=, this] { return k_->RmsNorm(out, rstd, inp, weight, rows, channels, eps); });
  }
  Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                         const void* weight, const void* rstd, int64_t rows,
                         int channels) override {
    return hook_.Op(OpInfo::Traffic("RmsNormBackward",
                                    NormBytes(rows, channels, dinp != nullptr ? 4 : 2, 1, 1) +
                                        2 * g_ * channels * (dweight != nullptr)),
                    [=, this] {
                      return k_->RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, rows,
                                                 channels);
                    });
  }
  Status AddRmsNorm(void* sum, void* out, void* rstd, const void* a, const void* b,
                    const void* weight, int64_t rows, int channels, float eps) override {
    return hook_.Op(OpInfo::Traffic("AddRmsNorm", NormBytes(rows, channels, 4, 1, 1)), [=, this] {
      return k_->AddRmsNorm(sum, out, rstd, a, b, weight, rows, channels, eps);
    });
  }
  Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                 int heads, int kv_heads, int head_size, const Rope& rope) override {
    return hook_.Op(
        OpInfo::Traffic("RopeQkv",
                        2 * Rows(int64_t{batch} * seq, (heads + 2 * kv_heads) * head_size) * a_),
        [=, this] {
          return k_->RopeQkv(qkv, q, k, v, batch, seq, heads, kv_heads, head_size, rope);
        });
  }
  Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) override {
    return hook_.Op(OpInfo::Traffic("RopeQkvBackward",
                                    Rows(int64_t{batch} * seq, head_size) * a_ *
                                        ((heads + 2 * kv_heads) +
                                         2 * (heads * (dq != nullptr) + kv_heads * (dk != nullptr) +
                                              kv_heads * (dv != nullptr)))),
                    [=, this] {
                      return k_->RopeQkvBackward(dq, dk, dv, dqkv, batch, seq, heads, kv_heads,
                                                 head_size, rope);
                    });
  }
  Status RopeQkvInPlace(void* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                        const Rope& rope, bool transpose) override {
    return hook_.Op(
        OpInfo::Traffic(transpose ? "RopeQkvInPlaceBackward" : "RopeQkvInPlace",
                        2 * Rows(int64_t{batch} * seq, (heads + kv_heads) * head_size) * a_),
        [=, this] {
          return k_->RopeQkvInPlace(qkv, batch, seq, heads, kv_heads, head_size, rope, transpose);
        });
  }
  Status SwiGlu(void* out, const void* gate_up, int64_t rows, int cols, bool interleaved) override {
    return hook_.Op(OpInfo::Traffic("SwiGlu", 3 * Rows(rows, cols) * a_),
                    [=, this] { return k_->SwiGlu(out, gate_up, rows, cols, interleaved); });
  }
  Status SwiGluBackward(void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                        int cols, bool interleaved) override {
    return hook_.Op(OpInfo::Traffic("SwiGluBackward", 5 * Rows(rows, cols) * a_), [=, this] {
      return k_->SwiGluBackward(dgate_up, dout, gate_up, rows, cols, interleaved);
    });
  }
  Status Gelu(void* out, const void* inp, int64_t n) override {
    return hook_.Op(OpInfo::Traffic("Gelu", 2.0 * n * a_),
                    [=, this] { return k_->Gelu(out, inp, n); });
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    return hook_.Op(OpInfo::Traffic("GeluBackward", 4.0 * n * a_),
                    [=, this] { return k_->GeluBackward(dinp, inp, dout, n); });
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    return hook_.Op(OpInfo::Traffic("Add", 3.0 * n * a_),
                    [=, this] { return k_->Add(out, a, b, n); });
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    return hook_.Op(OpInfo::Traffic("Accumulate", 3.0 * n * a_),
                    [=, this] { return k_->Accumulate(dst, src, n); });
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    return hook_.Op(OpInfo::Traffic("AccumulateGrad", 3.0 * n * g_),
                    [=, this] { return k_->AccumulateGrad(dst, src, n); });
  }
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    return hook_.Op(OpInfo::Traffic("VocabMax", Rows(rows, vocab) * a_ + rows * st_),
                    [=, this] { return k_->VocabMax(logits, max, rows, vocab, valid); });
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    return hook_.Op(OpInfo::Traffic("VocabSums", Rows(rows, vocab) * a_ + rows * (3 * st_ + 4)),
                    [=, this] {
                      return k_->VocabSums(logits, gmax, targets, sums, rows, vocab, valid, begin);
                    });
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    return hook_.Op(OpInfo::Traffic("VocabCrossEntropyFinish",
                                    2 * Rows(rows, vocab) * a_ + rows * (4 * st_ + 4)),
                    [=, this] {
                      return k_->VocabCrossEntropyFinish(logits, losses, gmax, gsums, targets, rows,
                                                         vocab, valid, begin, dscale);
                    });
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    return hook_.Op(OpInfo::Traffic("AddBias", 2 * Rows(rows, cols) * a_ + cols * a_),
                    [=, this] { return k_->AddBias(out, bias, rows, cols); });
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      int valid, float dscale) override {
    return hook_.Op(OpInfo::Traffic("CrossEntropy", (dscale != 0 ? 2 : 1) * Rows(rows, vocab) * a_ +
                                                        rows * (st_ + 4)),
                    [=, this] {
                      return k_->CrossEntropy(logits, losses, targets, rows, vocab, valid, dscale);
                    });
  }

 private:
  std::unique_ptr<ModelKernels> k_;  // runs every call
  Hook hook_;
  // Element sizes for OpInfo::bytes: activations, weight gradients, statistics.
  double a_, g_, st_;

  static double Rows(int64_t rows, int64_t cols) { return static_cast<double>(rows) * cols; }
  // A norm over rows x channels: `passes` row tensors in act dtype (read or written), `vectors`
  // weight vectors (act dtype) read, `stats` per-row statistics (stat dtype) moved.
  double NormBytes(int64_t rows, int channels, int passes, int vectors, int stats) const {
    return Rows(rows, channels) * passes * a_ + static_cast<double>(channels) * vectors * a_ +
           static_cast<double>(rows) * stats * st_;
  }
  // Embedding's traffic: out (rows x channels) and the token ids, a wte row per token (at most
  // `vocab_rows` distinct; where the vocabulary is split over ranks a token of another rank's
  // rows is counted too) and wpe, `table_bytes` moved per table element (the forward reads act
  // dtype; the backward reads and writes its gradients in grad dtype).
  double EmbeddingBytes(int batch, int seq, int channels, int vocab_rows, bool position,
                        double table_bytes) const {
    const double rows = static_cast<double>(batch) * seq;
    const double wte_rows = std::min<double>(rows, vocab_rows);
    return rows * channels * a_ + rows * 4 +
           table_bytes * channels * (wte_rows + (position ? seq : 0));
  }
};

}  // namespace zerort::internal
