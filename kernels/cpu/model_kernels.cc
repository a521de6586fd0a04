// ModelKernels on the CPU: the templated operations of model_ops.h behind the interface, in
// float (training) or double (finite-difference checks). Each runs its work when called, on the
// caller: on a stream of its own (immediate), or wrapped by stream_kernels.cc to run in the order
// of the stream it is given.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "zerort/kernels/cast.h"
#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/cpu/sgemm.h"
#include "zerort/kernels/cpu/stream_kernels.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/model_math.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/scoped_seconds.h"

namespace zerort {
namespace {

// A token's qkv row ([Note: the qkv layout]) for `channels` = heads x head size.
int64_t QkvRow(int channels, int heads, int kv_heads) {
  return math::QkvLayout{heads, kv_heads, channels / heads}.row();
}

template <typename T>
class CpuModelKernels final : public ModelKernels {
 public:
  // `flash_products`: what the flash attention rounds its probabilities and score gradients to
  // before their products (cpu::fast::FlashAttentionForward's `products`: the 16-bit kernels
  // pass their format).
  explicit CpuModelKernels(DType flash_products = DType::kF32)
      : stream_(*CreateStream(Device::Cpu(), "model")), flash_products_(flash_products) {}

  Device device() const override { return Device::Cpu(); }
  Stream& stream() override { return *stream_; }
  size_t act_size() const override { return sizeof(T); }
  size_t grad_size() const override { return sizeof(T); }
  size_t stat_size() const override { return sizeof(T); }
  std::optional<DType> act_dtype() const override { return DTypeIfAny<T>(); }
  std::optional<DType> grad_dtype() const override { return DTypeIfAny<T>(); }
  std::optional<DType> stat_dtype() const override { return DTypeIfAny<T>(); }
  Status ActToHost(const void* src, int64_t n, double* out) override {
    std::copy(P(src), P(src) + n, out);
    return absl::OkStatus();
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    return ActToHost(src, n, out);
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    cpu::EmbeddingForward<T>(P(out), tokens, P(wte), P(wpe), batch, seq, channels, vocab_begin,
                             vocab_count);
    return absl::OkStatus();
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    cpu::EmbeddingBackward<T>(P(dwte), P(dwpe), P(dout), tokens, batch, seq, channels, vocab_begin,
                              vocab_count);
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
  Status AddLayerNorm(void* sum, void* out, void* mean, void* rstd, const void* a, const void* b,
                      const void* weight, const void* bias, int64_t rows, int channels) override {
    if constexpr (std::is_same_v<T, float>) {
      cpu::fast::AddLayerNormForward(P(sum), P(out), P(mean), P(rstd), P(a), P(b), P(weight),
                                     P(bias), rows, channels,
                                     static_cast<float>(cpu::kLayerNormEps));
      return absl::OkStatus();
    }
    return ModelKernels::AddLayerNorm(sum, out, mean, rstd, a, b, weight, bias, rows, channels);
  }
  const Seconds* seconds() const override { return &seconds_; }
  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    const ScopedSeconds timed(&seconds_.matmul);
    cpu::MatmulForward<T>(P(out), P(inp), P(weight), P(bias), rows, in, out_features);
    return absl::OkStatus();
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    const ScopedSeconds timed(&seconds_.matmul);
    cpu::MatmulBackward<T>(P(dinp), P(dweight), P(dbias), P(dout), P(inp), P(weight), rows, in,
                           out_features);
    return absl::OkStatus();
  }
  // float: the GEMM without bias, then bias and GELU in one pass over each row of `pre`.
  Status MatmulGelu(void* pre, void* out, const void* inp, const void* weight, const void* bias,
                    int64_t rows, int in, int out_features) override {
    if constexpr (std::is_same_v<T, float>) {
      {
        const ScopedSeconds timed(&seconds_.matmul);
        cpu::Sgemm(false, true, rows, out_features, in, P(inp), in, P(weight), in, 0.0f, P(pre),
                   out_features);
      }
      cpu::fast::BiasGelu(P(pre), P(out), P(bias), rows, out_features);
      return absl::OkStatus();
    }
    return ModelKernels::MatmulGelu(pre, out, inp, weight, bias, rows, in, out_features);
  }
  // float: flash-style, saving the log-sum-exp per query; double (the gradient checks' reference):
  // the probabilities.
  KernelBackend backend() const override {
    return std::is_same_v<T, float> ? KernelBackend::kCpu : KernelBackend::kCpuDouble;
  }
  AttentionProgram attention_program(int batch, int heads, int head_size) const override {
    return AttentionProgramFor(backend(), sizeof(T), batch, heads, head_size);
  }
  Status Attention(void* out, void* saved, const void* qkv, int batch, int seq, int channels,
                   int heads, int kv_heads) override {
    const ScopedSeconds timed(&seconds_.attention);
    if constexpr (std::is_same_v<T, float>) {
      cpu::fast::FlashAttentionForward(P(out), P(saved), P(qkv), batch, seq, channels, heads,
                                       kv_heads, flash_products_);
    } else {
      cpu::AttentionForward<T>(P(out), P(saved), P(qkv), batch, seq, channels, heads, kv_heads);
    }
    return absl::OkStatus();
  }
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const void* saved, int batch, int seq, int channels, int heads,
                           int kv_heads) override {
    const ScopedSeconds timed(&seconds_.attention);
    if constexpr (std::is_same_v<T, float>) {
      cpu::fast::FlashAttentionBackward(P(dqkv), P(dout), P(qkv), P(out), P(saved), batch, seq,
                                        channels, heads, kv_heads, flash_products_);
    } else {
      cpu::AttentionBackward<T>(P(dqkv), P(dout), P(qkv), P(saved), batch, seq, channels, heads,
                                kv_heads);
    }
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
  Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                 int channels, float eps) override {
    cpu::RmsNormForward<T>(P(out), P(rstd), P(inp), P(weight), rows, channels, static_cast<T>(eps));
    return absl::OkStatus();
  }
  Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                         const void* weight, const void* rstd, int64_t rows,
                         int channels) override {
    cpu::RmsNormBackward<T>(P(dinp), P(dweight), P(dout), P(inp), P(weight), P(rstd), rows,
                            channels);
    return absl::OkStatus();
  }
  Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                 int heads, int kv_heads, int head_size, const Rope& rope) override {
    cpu::RopeQkvForward<T>(P(qkv), P(q), P(k), P(v), batch, seq, heads, kv_heads, head_size, rope);
    return absl::OkStatus();
  }
  Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) override {
    cpu::RopeQkvBackward<T>(P(dq), P(dk), P(dv), P(dqkv), batch, seq, heads, kv_heads, head_size,
                            rope);
    return absl::OkStatus();
  }
  Status RopeQkvInPlace(void* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                        const Rope& rope, bool transpose) override {
    cpu::RopeQkvInPlace<T>(P(qkv), batch, seq, heads, kv_heads, head_size, rope, transpose);
    return absl::OkStatus();
  }
  Status SwiGlu(void* out, const void* gate_up, int64_t rows, int cols, bool interleaved) override {
    cpu::SwiGluForward<T>(P(out), P(gate_up), rows, cols, interleaved);
    return absl::OkStatus();
  }
  Status SwiGluBackward(void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                        int cols, bool interleaved) override {
    cpu::SwiGluBackward<T>(P(dgate_up), P(dout), P(gate_up), rows, cols, interleaved);
    return absl::OkStatus();
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    T* o = P(out);
    const T* x = P(a);
    const T* y = P(b);
    if constexpr (std::is_same_v<T, float>) {
      cpu::fast::Add(o, x, y, n);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    }
    return absl::OkStatus();
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    T* d = P(dst);
    const T* s = P(src);
    if constexpr (std::is_same_v<T, float>) {
      cpu::fast::Accumulate(d, s, n);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    }
    return absl::OkStatus();
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    return Accumulate(dst, src, n);  // gradients are T too
  }
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    const T* z = P(logits);
    T* m = P(max);
    for (int64_t r = 0; r < rows; ++r) {
      T v = -std::numeric_limits<T>::infinity();
      for (int c = 0; c < valid; ++c) v = std::max(v, z[r * vocab + c]);
      m[r] = v;
    }
    return absl::OkStatus();
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    const T* z = P(logits);
    const T* m = P(gmax);
    T* out = P(sums);
    for (int64_t r = 0; r < rows; ++r) {
      T sum = 0;
      for (int c = 0; c < valid; ++c) sum += std::exp(z[r * vocab + c] - m[r]);
      const int t = targets[r] - begin;
      out[r] = sum;
      out[rows + r] = t >= 0 && t < valid ? z[r * vocab + t] : T(0);
    }
    return absl::OkStatus();
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    T* z = P(logits);
    const T* m = P(gmax);
    const T* s = P(gsums);
    T* l = P(losses);
    const T scale = T(dscale);
    for (int64_t r = 0; r < rows; ++r) {
      l[r] = math::VocabLoss<T>(std::log(s[r]), m[r], s[rows + r]);
      if (dscale == 0.0f) continue;
      for (int c = 0; c < vocab; ++c) {
        T& v = z[r * vocab + c];
        if (c >= valid) {
          v = 0;
          continue;
        }
        v = math::VocabGrad<T>(std::exp(v - m[r]), s[r], c + begin == targets[r], scale);
      }
    }
    return absl::OkStatus();
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    T* o = P(out);
    const T* b = P(bias);
    for (int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) o[r * cols + c] += b[c];
    }
    return absl::OkStatus();
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      int valid, float dscale) override {
    cpu::SoftmaxCrossEntropyFused<T>(P(logits), P(losses), targets, rows, vocab, valid, T(dscale));
    return absl::OkStatus();
  }

 private:
  static T* P(void* p) { return static_cast<T*>(p); }
  static const T* P(const void* p) { return static_cast<const T*>(p); }

  std::unique_ptr<Stream> stream_;
  DType flash_products_;
  Seconds seconds_;
};

// 16-bit (bf16 or fp16) activations and weights with fp32 math: every operand is widened to
// fp32, the float kernel runs, and each result is rounded back (to nearest even) once. Gradients
// of weights are fp32 (the shard manager's reduce dtype); statistics and losses fp32. `Format`
// gives the conversions: Bf16Format or F16Format.
struct Bf16Format {
  static constexpr DType kDType = DType::kBF16;
  static float ToFloat(uint16_t bits) { return Bf16BitsToFloat(bits); }
  static uint16_t FromFloat(float v) { return FloatToBf16Bits(v); }
};
struct F16Format {
  static constexpr DType kDType = DType::kF16;
  static float ToFloat(uint16_t bits) { return F16BitsToFloat(bits); }
  static uint16_t FromFloat(float v) { return FloatToF16Bits(v); }
};

template <typename Format>
class Cpu16ModelKernels final : public ModelKernels {
 public:
  Device device() const override { return Device::Cpu(); }
  Stream& stream() override { return f_.stream(); }
  const Seconds* seconds() const override { return f_.seconds(); }  // conversions excluded
  size_t act_size() const override { return 2; }
  size_t grad_size() const override { return 4; }
  size_t stat_size() const override { return 4; }
  std::optional<DType> act_dtype() const override { return Format::kDType; }
  std::optional<DType> grad_dtype() const override { return DType::kF32; }
  std::optional<DType> stat_dtype() const override { return DType::kF32; }

  Status ActToHost(const void* src, int64_t n, double* out) override {
    const auto* bits = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) out[i] = Format::ToFloat(bits[i]);
    return absl::OkStatus();
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    return f_.StatToHost(src, n, out);
  }
  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    // Only the rows up to the largest token used are widened.
    const int64_t n = int64_t{batch} * seq;
    const int vocab_rows =
        std::clamp<int>(MaxToken(tokens, n) - vocab_begin + 1, 0, std::max(vocab_count, 0));
    F o(this, out, n * channels, false);
    Scratch pe;
    if (wpe != nullptr) pe = In(wpe, int64_t{seq} * channels);
    ZR_RETURN_IF_ERROR(f_.Embedding(
        o.data(), tokens, In(wte, int64_t{vocab_rows} * channels).data(),
        wpe == nullptr ? nullptr : pe.data(), batch, seq, channels, vocab_begin, vocab_rows));
    return o.Store();
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    return f_.EmbeddingBackward(dwte, dwpe, In(dout, int64_t{batch} * seq * channels).data(),
                                tokens, batch, seq, channels, vocab_begin, vocab_count);
  }
  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    F o(this, out, rows * channels, false);
    ZR_RETURN_IF_ERROR(f_.LayerNorm(o.data(), mean, rstd, In(inp, rows * channels).data(),
                                    In(weight, channels).data(), In(bias, channels).data(), rows,
                                    channels));
    return o.Store();
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    F di(this, dinp, rows * channels, true);
    ZR_RETURN_IF_ERROR(f_.LayerNormBackward(
        di.data(), dweight, dbias, In(dout, rows * channels).data(),
        In(inp, rows * channels).data(), In(weight, channels).data(), mean, rstd, rows, channels));
    return di.Store();
  }
  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    F o(this, out, rows * out_features, false);
    ZR_RETURN_IF_ERROR(MatmulWidened(o.data(), inp, weight, bias, rows, in, out_features));
    return o.Store();
  }
  // The product and the residual added in fp32, out rounded once (the CUDA kernels' cuBLASLt
  // call with the residual as C).
  Status MatmulResidual(void* out, const void* inp, const void* weight, const void* bias,
                        const void* residual, int64_t rows, int in, int out_features) override {
    ZR_RETURN_IF_ERROR(CheckMatmulResidual(out, residual));
    const int64_t n = rows * out_features;
    F o(this, out, n, false);
    ZR_RETURN_IF_ERROR(MatmulWidened(o.data(), inp, weight, bias, rows, in, out_features));
    ZR_RETURN_IF_ERROR(f_.Add(o.data(), o.data(), In(residual, n).data(), n));
    return o.Store();
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    F di(this, dinp, rows * in, true);
    ZR_RETURN_IF_ERROR(f_.MatmulBackward(
        di.data(), dweight, dbias, In(dout, rows * out_features).data(), In(inp, rows * in).data(),
        In(weight, int64_t{out_features} * in).data(), rows, in, out_features));
    return di.Store();
  }
  // The float kernels' saved state (fp32 log-sum-exp), kept in fp32.
  KernelBackend backend() const override { return f_.backend(); }
  AttentionProgram attention_program(int batch, int heads, int head_size) const override {
    return f_.attention_program(batch, heads, head_size);
  }
  Status Attention(void* out, void* saved, const void* qkv, int batch, int seq, int channels,
                   int heads, int kv_heads) override {
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t nqkv = int64_t{batch} * seq * QkvRow(channels, heads, kv_heads);
    F o(this, out, n, false);
    ZR_RETURN_IF_ERROR(
        f_.Attention(o.data(), saved, In(qkv, nqkv).data(), batch, seq, channels, heads, kv_heads));
    return o.Store();
  }
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* out,
                           const void* saved, int batch, int seq, int channels, int heads,
                           int kv_heads) override {
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t nqkv = int64_t{batch} * seq * QkvRow(channels, heads, kv_heads);
    F d(this, dqkv, nqkv, false);  // written, not added to
    ZR_RETURN_IF_ERROR(f_.AttentionBackward(d.data(), In(dout, n).data(), In(qkv, nqkv).data(),
                                            In(out, n).data(), saved, batch, seq, channels, heads,
                                            kv_heads));
    return d.Store();
  }
  Status Gelu(void* out, const void* inp, int64_t n) override {
    F o(this, out, n, false);
    ZR_RETURN_IF_ERROR(f_.Gelu(o.data(), In(inp, n).data(), n));
    return o.Store();
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    F d(this, dinp, n, true);
    ZR_RETURN_IF_ERROR(f_.GeluBackward(d.data(), In(inp, n).data(), In(dout, n).data(), n));
    return d.Store();
  }
  Status RmsNorm(void* out, void* rstd, const void* inp, const void* weight, int64_t rows,
                 int channels, float eps) override {
    F o(this, out, rows * channels, false);
    ZR_RETURN_IF_ERROR(f_.RmsNorm(o.data(), rstd, In(inp, rows * channels).data(),
                                  In(weight, channels).data(), rows, channels, eps));
    return o.Store();
  }
  Status RmsNormBackward(void* dinp, void* dweight, const void* dout, const void* inp,
                         const void* weight, const void* rstd, int64_t rows,
                         int channels) override {
    F di(this, dinp, rows * channels, true);
    ZR_RETURN_IF_ERROR(f_.RmsNormBackward(di.data(), dweight, In(dout, rows * channels).data(),
                                          In(inp, rows * channels).data(),
                                          In(weight, channels).data(), rstd, rows, channels));
    return di.Store();
  }
  Status RopeQkv(void* qkv, const void* q, const void* k, const void* v, int batch, int seq,
                 int heads, int kv_heads, int head_size, const Rope& rope) override {
    const int64_t rows = int64_t{batch} * seq, c = int64_t{heads} * head_size,
                  kv = int64_t{kv_heads} * head_size;
    F o(this, qkv, rows * (c + 2 * kv), false);
    ZR_RETURN_IF_ERROR(f_.RopeQkv(o.data(), In(q, rows * c).data(), In(k, rows * kv).data(),
                                  In(v, rows * kv).data(), batch, seq, heads, kv_heads, head_size,
                                  rope));
    return o.Store();
  }
  Status RopeQkvBackward(void* dq, void* dk, void* dv, const void* dqkv, int batch, int seq,
                         int heads, int kv_heads, int head_size, const Rope& rope) override {
    const int64_t rows = int64_t{batch} * seq, c = int64_t{heads} * head_size,
                  kv = int64_t{kv_heads} * head_size;
    F q(this, dq, rows * c, true), k(this, dk, rows * kv, true), v(this, dv, rows * kv, true);
    ZR_RETURN_IF_ERROR(f_.RopeQkvBackward(q.data(), k.data(), v.data(),
                                          In(dqkv, rows * (c + 2 * kv)).data(), batch, seq, heads,
                                          kv_heads, head_size, rope));
    ZR_RETURN_IF_ERROR(q.Store());
    ZR_RETURN_IF_ERROR(k.Store());
    return v.Store();
  }
  Status RopeQkvInPlace(void* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                        const Rope& rope, bool transpose) override {
    F x(this, qkv, int64_t{batch} * seq * (heads + 2 * kv_heads) * head_size, true);
    ZR_RETURN_IF_ERROR(
        f_.RopeQkvInPlace(x.data(), batch, seq, heads, kv_heads, head_size, rope, transpose));
    return x.Store();
  }
  Status SwiGlu(void* out, const void* gate_up, int64_t rows, int cols, bool interleaved) override {
    const int64_t n = rows * cols;
    F o(this, out, n, false);
    ZR_RETURN_IF_ERROR(f_.SwiGlu(o.data(), In(gate_up, 2 * n).data(), rows, cols, interleaved));
    return o.Store();
  }
  Status SwiGluBackward(void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                        int cols, bool interleaved) override {
    const int64_t n = rows * cols;
    F d(this, dgate_up, 2 * n, false);  // written, not added to
    ZR_RETURN_IF_ERROR(f_.SwiGluBackward(d.data(), In(dout, n).data(), In(gate_up, 2 * n).data(),
                                         rows, cols, interleaved));
    return d.Store();
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    F o(this, out, n, false);
    ZR_RETURN_IF_ERROR(f_.Add(o.data(), In(a, n).data(), In(b, n).data(), n));
    return o.Store();
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    F d(this, dst, n, true);
    ZR_RETURN_IF_ERROR(f_.Accumulate(d.data(), In(src, n).data(), n));
    return d.Store();
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    return f_.Accumulate(dst, src, n);  // weight gradients are fp32
  }
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    return f_.VocabMax(In(logits, rows * vocab).data(), max, rows, vocab, valid);
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    return f_.VocabSums(In(logits, rows * vocab).data(), gmax, targets, sums, rows, vocab, valid,
                        begin);
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    F z(this, logits, rows * vocab, true);
    ZR_RETURN_IF_ERROR(f_.VocabCrossEntropyFinish(z.data(), losses, gmax, gsums, targets, rows,
                                                  vocab, valid, begin, dscale));
    return dscale != 0.0f ? z.Store() : absl::OkStatus();
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    F o(this, out, rows * cols, true);
    ZR_RETURN_IF_ERROR(f_.AddBias(o.data(), In(bias, cols).data(), rows, cols));
    return o.Store();
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      int valid, float dscale) override {
    F z(this, logits, rows * vocab, true);
    ZR_RETURN_IF_ERROR(f_.CrossEntropy(z.data(), losses, targets, rows, vocab, valid, dscale));
    return dscale != 0.0f ? z.Store() : absl::OkStatus();
  }

 private:
  // fp32 scratch for widened operands, kept across calls: a fresh zero-filled std::vector per
  // operand faulted in up to 200 MB (GPT-2's logits) per call, 12% of a bf16 step. Grow-only;
  // these host buffers are the CPU kernels' own and not in the memory tracker.
  struct Block {
    std::unique_ptr<float[]> data;
    size_t capacity = 0;
  };
  class Scratch {  // a block of at least n floats (not initialised), back to the pool at the end
   public:
    Scratch() = default;
    Scratch(std::vector<Block>* pool, size_t n) : pool_(pool) {
      // The smallest free block that holds n, else a new one.
      auto best = pool->end();
      for (auto it = pool->begin(); it != pool->end(); ++it) {
        if (it->capacity >= n && (best == pool->end() || it->capacity < best->capacity)) best = it;
      }
      if (best != pool->end()) {
        block_ = std::move(*best);
        pool->erase(best);
      } else {
        block_ = {std::make_unique_for_overwrite<float[]>(n), n};
      }
    }
    Scratch(Scratch&& o) noexcept
        : pool_(std::exchange(o.pool_, nullptr)), block_(std::move(o.block_)) {}
    Scratch& operator=(Scratch&& o) noexcept {
      Return();
      pool_ = std::exchange(o.pool_, nullptr);
      block_ = std::move(o.block_);
      return *this;
    }
    ~Scratch() { Return(); }
    float* data() { return block_.data.get(); }

   private:
    void Return() {
      if (pool_ != nullptr && block_.data) pool_->push_back(std::move(block_));
      pool_ = nullptr;
    }
    std::vector<Block>* pool_ = nullptr;
    Block block_;
  };

  // A 16-bit buffer widened to fp32 (loaded when the op reads or accumulates into it; otherwise
  // the op writes every element) and stored back, rounded, by Store(). A null buffer (a gradient
  // the caller skips) stays null: data() is nullptr, so the float kernels skip it too (a scratch
  // block in its place, of whatever size the pool had, was written rows x channels long).
  class F {
   public:
    F(Cpu16ModelKernels* k, void* bits, int64_t n, bool load)
        : bits_(static_cast<uint16_t*>(bits)),
          n_(bits ? n : 0),
          v_(&k->pool_, static_cast<size_t>(n_)) {
      if (load && bits_ != nullptr)
        internal::CpuCast(bits_, Format::kDType, v_.data(), DType::kF32, n);
    }
    float* data() { return bits_ != nullptr ? v_.data() : nullptr; }
    Status Store() {
      if (bits_ != nullptr) internal::CpuCast(v_.data(), DType::kF32, bits_, Format::kDType, n_);
      return absl::OkStatus();
    }

   private:
    uint16_t* bits_;
    int64_t n_;
    Scratch v_;
  };
  Scratch In(const void* bits, int64_t n) {
    Scratch v(&pool_, static_cast<size_t>(n));
    internal::CpuCast(bits, Format::kDType, v.data(), DType::kF32, n);  // threaded, vectorised
    return v;
  }
  // The float kernels' Matmul of the widened operands into `out` (fp32, not rounded).
  Status MatmulWidened(float* out, const void* inp, const void* weight, const void* bias,
                       int64_t rows, int in, int out_features) {
    Scratch b;
    if (bias != nullptr) b = In(bias, out_features);
    return f_.Matmul(out, In(inp, rows * in).data(), In(weight, int64_t{out_features} * in).data(),
                     bias != nullptr ? b.data() : nullptr, rows, in, out_features);
  }
  static int MaxToken(const int32_t* tokens, int64_t n) {
    int m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, tokens[i]);
    return m;
  }
  // The attention's P and dS rounded as the CUDA flash kernels round them.
  CpuModelKernels<float> f_{Format::kDType};
  std::vector<Block> pool_;
};

}  // namespace

std::unique_ptr<ModelKernels> MakeCpuModelKernels(CpuPrecision precision, Stream* stream) {
  std::unique_ptr<ModelKernels> k;
  if (precision == CpuPrecision::kDouble) {
    k = std::make_unique<CpuModelKernels<double>>();
  } else if (precision == CpuPrecision::kBf16) {
    k = std::make_unique<Cpu16ModelKernels<Bf16Format>>();
  } else if (precision == CpuPrecision::kF16) {
    k = std::make_unique<Cpu16ModelKernels<F16Format>>();
  } else {
    k = std::make_unique<CpuModelKernels<float>>();
  }
  return stream != nullptr ? internal::IssueOnStream(std::move(k), *stream) : std::move(k);
}

}  // namespace zerort
