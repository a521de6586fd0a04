// CPU kernels issued on a stream: every call of the wrapped kernels runs in the stream's order
// (at once on an immediate CPU stream, on its thread for a queued one), as the CUDA kernels'
// launches do on theirs. Arguments are captured by value, so the buffers they point to must stay
// alive until the stream reaches the call (the caching allocator's stream-ordered rules). The
// host reads (ActToHost, StatToHost) synchronise the stream first, as cudaMemcpy to the host does.
#include <memory>
#include <utility>

#include "zerort/kernels/cpu/stream_kernels.h"

namespace zerort::internal {
namespace {

class StreamOrderedKernels final : public ModelKernels {
 public:
  StreamOrderedKernels(std::unique_ptr<ModelKernels> inner, Stream& stream)
      : k_(std::move(inner)), stream_(stream) {}
  // Work still queued (a step that failed part-way) calls the inner kernels: it runs first.
  ~StreamOrderedKernels() override { (void)stream_.Synchronize(); }

  Device device() const override { return k_->device(); }
  Stream& stream() override { return stream_; }
  size_t act_size() const override { return k_->act_size(); }
  KernelBackend backend() const override { return k_->backend(); }
  size_t grad_size() const override { return k_->grad_size(); }
  size_t stat_size() const override { return k_->stat_size(); }
  std::optional<DType> act_dtype() const override { return k_->act_dtype(); }
  std::optional<DType> grad_dtype() const override { return k_->grad_dtype(); }
  std::optional<DType> stat_dtype() const override { return k_->stat_dtype(); }
  // Counted on the stream's thread: read after the stream is synchronised.
  const Seconds* seconds() const override { return k_->seconds(); }

  Status ActToHost(const void* src, int64_t n, double* out) override {
    ZR_RETURN_IF_ERROR(stream_.Synchronize());
    return k_->ActToHost(src, n, out);
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    ZR_RETURN_IF_ERROR(stream_.Synchronize());
    return k_->StatToHost(src, n, out);
  }
  // On the stream's thread, into the inner kernels' ledger: no wait per micro-batch.
  Status AddToLossLedger(const void* src, int64_t n, double divisor) override {
    return Issue([=, this] { return k_->AddToLossLedger(src, n, divisor); });
  }
  StatusOr<double> TakeLossLedger() override {
    ZR_RETURN_IF_ERROR(stream_.Synchronize());
    return k_->TakeLossLedger();
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    return Issue([=, this] {
      return k_->Embedding(out, tokens, wte, wpe, batch, seq, channels, vocab_begin, vocab_count);
    });
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    return Issue([=, this] {
      return k_->EmbeddingBackward(dwte, dwpe, dout, tokens, batch, seq, channels, vocab_begin,
                                   vocab_count);
    });
  }
  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    return Issue(
        [=, this] { return k_->LayerNorm(out, mean, rstd, inp, weight, bias, rows, channels); });
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    return Issue([=, this] {
      return k_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows,
                                   channels);
    });
  }
  Status AddLayerNorm(void* sum, void* out, void* mean, void* rstd, const void* a, const void* b,
                      const void* weight, const void* bias, int64_t rows, int channels) override {
    return Issue([=, this] {
      return k_->AddLayerNorm(sum, out, mean, rstd, a, b, weight, bias, rows, channels);
    });
  }
  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    return Issue([=, this] { return k_->Matmul(out, inp, weight, bias, rows, in, out_features); });
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    return Issue([=, this] {
      return k_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, rows, in, out_features);
    });
  }
  Status MatmulGelu(void* pre, void* out, const void* inp, const void* weight, const void* bias,
                    int64_t rows, int in, int out_features) override {
    return Issue(
        [=, this] { return k_->MatmulGelu(pre, out, inp, weight, bias, rows, in, out_features); });
  }
  Status Attention(void* out, void* saved, const void* qkv, int batch, int seq, int channels,
                   int heads, int kv_heads) override {
    return Issue([=, this] {
      return k_->Attention(out, saved, qkv, batch, seq, channels, heads, kv_heads);
    });
  }
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const void* saved, int batch, int seq, int channels, int heads,
                           int kv_heads) override {
    return Issue([=, this] {
      return k_->AttentionBackward(dqkv, dout, qkv, out, saved, batch, seq, channels, heads,
                                   kv_heads);
    });
  }
  Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                 int channels, float eps) override {
    return Issue([=, this] { return k_->RmsNorm(out, rstd, inp, weight, rows, channels, eps); });
  }
  Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                         const void* weight, const void* rstd, int64_t rows,
                         int channels) override {
    return Issue([=, this] {
      return k_->RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, rows, channels);
    });
  }
  Status AddRmsNorm(void* sum, void* out, void* rstd, const void* a, const void* b,
                    const void* weight, int64_t rows, int channels, float eps) override {
    return Issue(
        [=, this] { return k_->AddRmsNorm(sum, out, rstd, a, b, weight, rows, channels, eps); });
  }
  Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                 int heads, int kv_heads, int head_size, const Rope& rope) override {
    return Issue([=, this] {
      return k_->RopeQkv(qkv, q, k, v, batch, seq, heads, kv_heads, head_size, rope);
    });
  }
  Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) override {
    return Issue([=, this] {
      return k_->RopeQkvBackward(dq, dk, dv, dqkv, batch, seq, heads, kv_heads, head_size, rope);
    });
  }
  Status SwiGlu(void* out, const void* gate, const void* up, int64_t n) override {
    return Issue([=, this] { return k_->SwiGlu(out, gate, up, n); });
  }
  Status SwiGluBackward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                        int64_t n) override {
    return Issue([=, this] { return k_->SwiGluBackward(dgate, dup, dout, gate, up, n); });
  }
  Status Gelu(void* out, const void* inp, int64_t n) override {
    return Issue([=, this] { return k_->Gelu(out, inp, n); });
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    return Issue([=, this] { return k_->GeluBackward(dinp, inp, dout, n); });
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    return Issue([=, this] { return k_->Add(out, a, b, n); });
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    return Issue([=, this] { return k_->Accumulate(dst, src, n); });
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    return Issue([=, this] { return k_->AccumulateGrad(dst, src, n); });
  }
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    return Issue([=, this] { return k_->VocabMax(logits, max, rows, vocab, valid); });
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    return Issue([=, this] {
      return k_->VocabSums(logits, gmax, targets, sums, rows, vocab, valid, begin);
    });
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    return Issue([=, this] {
      return k_->VocabCrossEntropyFinish(logits, losses, gmax, gsums, targets, rows, vocab, valid,
                                         begin, dscale);
    });
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    return Issue([=, this] { return k_->AddBias(out, bias, rows, cols); });
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      float dscale) override {
    return Issue(
        [=, this] { return k_->CrossEntropy(logits, losses, targets, rows, vocab, dscale); });
  }

 private:
  // On an immediate stream the call runs here, without wrapping it in a std::function (one heap
  // allocation per kernel call otherwise).
  template <typename Work>
  Status Issue(Work&& work) {
    if (!stream_.asynchronous()) return work();
    return stream_.Launch(std::forward<Work>(work));
  }

  std::unique_ptr<ModelKernels> k_;  // runs every call; its own stream is never used
  Stream& stream_;
};

}  // namespace

std::unique_ptr<ModelKernels> IssueOnStream(std::unique_ptr<ModelKernels> kernels, Stream& stream) {
  return std::make_unique<StreamOrderedKernels>(std::move(kernels), stream);
}

}  // namespace zerort::internal
