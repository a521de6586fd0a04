// ModelKernels on the CPU: the templated operations of model_ops.h behind the interface, in
// float (training) or double (finite-difference checks). Synchronous: the stream is a CPU stream.
#include <algorithm>
#include <memory>

#include "kernels/model_kernels.h"
#include "kernels/model_ops.h"

namespace zerort {
namespace {

template <typename T>
class CpuModelKernels final : public ModelKernels {
 public:
  CpuModelKernels() : stream_(*CreateStream(Device::Cpu(), "model")) {}

  Device device() const override { return Device::Cpu(); }
  Stream& stream() override { return *stream_; }
  size_t act_size() const override { return sizeof(T); }
  size_t grad_size() const override { return sizeof(T); }
  size_t stat_size() const override { return sizeof(T); }
  Status ActToHost(const void* src, int64_t n, double* out) override {
    std::copy(P(src), P(src) + n, out);
    return absl::OkStatus();
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    return ActToHost(src, n, out);
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels) override {
    cpu::EmbeddingForward<T>(P(out), tokens, P(wte), P(wpe), batch, seq, channels);
    return absl::OkStatus();
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels) override {
    cpu::EmbeddingBackward<T>(P(dwte), P(dwpe), P(dout), tokens, batch, seq, channels);
    return absl::OkStatus();
  }
  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    cpu::LayerNormForward<T>(P(out), P(mean), P(rstd), P(inp), P(weight), P(bias), rows, channels);
    return absl::OkStatus();
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    cpu::LayerNormBackward<T>(P(dinp), P(dweight), P(dbias), P(dout), P(inp), P(weight), P(mean),
                              P(rstd), rows, channels);
    return absl::OkStatus();
  }
  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    cpu::MatmulForward<T>(P(out), P(inp), P(weight), P(bias), rows, in, out_features);
    return absl::OkStatus();
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    cpu::MatmulBackward<T>(P(dinp), P(dweight), P(dbias), P(dout), P(inp), P(weight), rows, in,
                           out_features);
    return absl::OkStatus();
  }
  Status Attention(void* out, void* att, const void* qkv, int batch, int seq, int channels,
                   int heads) override {
    cpu::AttentionForward<T>(P(out), P(att), P(qkv), batch, seq, channels, heads);
    return absl::OkStatus();
  }
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* att,
                           int batch, int seq, int channels, int heads) override {
    cpu::AttentionBackward<T>(P(dqkv), P(dout), P(qkv), P(att), batch, seq, channels, heads);
    return absl::OkStatus();
  }
  Status Gelu(void* out, const void* inp, int64_t n) override {
    cpu::GeluForward<T>(P(out), P(inp), n);
    return absl::OkStatus();
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    cpu::GeluBackward<T>(P(dinp), P(inp), P(dout), n);
    return absl::OkStatus();
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    T* o = P(out);
    const T* x = P(a);
    const T* y = P(b);
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    return absl::OkStatus();
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    T* d = P(dst);
    const T* s = P(src);
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    return absl::OkStatus();
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      float dloss) override {
    cpu::SoftmaxCrossEntropyFused<T>(P(logits), P(losses), targets, rows, vocab, T(dloss));
    return absl::OkStatus();
  }

 private:
  static T* P(void* p) { return static_cast<T*>(p); }
  static const T* P(const void* p) { return static_cast<const T*>(p); }

  std::unique_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<ModelKernels> MakeCpuModelKernels(CpuPrecision precision) {
  if (precision == CpuPrecision::kDouble) return std::make_unique<CpuModelKernels<double>>();
  return std::make_unique<CpuModelKernels<float>>();
}

}  // namespace zerort
