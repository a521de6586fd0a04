// The GPT model's CPU operations; explicit instantiations for float and double. The code here is
// the readable reference (the double instantiation, for gradient checks); float, the training
// path, goes to the threaded and vectorised versions of fast_ops.h, tested against it.
#include "zerort/kernels/model_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/cpu/sgemm.h"
#include "zerort/kernels/model_math.h"

namespace zerort::cpu {
namespace {

// C[m, n] (+)= A[m, k] * op(B) with row-major operands: float through sgemm.h (oneDNN or
// OpenBLAS), double through OpenBLAS.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    Sgemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
  } else {
    const auto ta = trans_a ? CblasTrans : CblasNoTrans;
    const auto tb = trans_b ? CblasTrans : CblasNoTrans;
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t rows, int in,
                   int out_features) {
  if constexpr (std::is_same_v<T, float>) {
    fast::FillRows(out, bias, rows, out_features);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out_features; ++o)
        out[r * out_features + o] = bias != nullptr ? bias[o] : T(0);
    }
  }
  // out[rows, out] += inp[rows, in] * weight[out, in]^T
  Gemm<T>(false, true, rows, out_features, in, inp, in, weight, in, T(1), out, out_features);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int64_t rows, int in, int out_features) {
  // dinp[rows, in] += dout[rows, out] * weight[out, in]
  if (dinp != nullptr)
    Gemm<T>(false, false, rows, in, out_features, dout, out_features, weight, in, T(1), dinp, in);
  // dweight[out, in] += dout^T[out, rows] * inp[rows, in]
  if (dweight != nullptr)
    Gemm<T>(true, false, out_features, in, rows, dout, out_features, inp, in, T(1), dweight, in);
  if constexpr (std::is_same_v<T, float>) {
    if (dbias != nullptr) fast::AddColumnSums(dbias, dout, rows, out_features);
    return;
  }
  if (dbias != nullptr) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out_features; ++o) dbias[o] += dout[r * out_features + o];
    }
  }
}

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int64_t rows, int channels, T eps) {
  if constexpr (std::is_same_v<T, float>) {
    return fast::LayerNormForward(out, mean, rstd, inp, weight, bias, rows, channels, eps);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * channels;
    T m = 0;
    for (int c = 0; c < channels; ++c) m += x[c];
    m /= channels;
    T v = 0;
    for (int c = 0; c < channels; ++c) v += (x[c] - m) * (x[c] - m);
    v /= channels;
    const T s = T(1) / std::sqrt(v + eps);
    for (int c = 0; c < channels; ++c) out[r * channels + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int64_t rows, int channels) {
  if constexpr (std::is_same_v<T, float>) {
    return fast::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows,
                                   channels);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * channels;
    const T* dy = dout + r * channels;
    // dnorm = dy * weight; dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
    T dnorm_mean = 0;
    T dnorm_norm_mean = 0;
    for (int c = 0; c < channels; ++c) {
      const T norm = (x[c] - mean[r]) * rstd[r];
      const T dnorm = dy[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= channels;
    dnorm_norm_mean /= channels;
    for (int c = 0; c < channels; ++c) {
      const T norm = (x[c] - mean[r]) * rstd[r];
      const T dnorm = dy[c] * weight[c];
      if (dbias != nullptr) dbias[c] += dy[c];
      if (dweight != nullptr) dweight[c] += norm * dy[c];
      if (dinp != nullptr)
        dinp[r * channels + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[r];
    }
  }
}

namespace {
template <typename T>
constexpr T kGeluScale = T(0.7978845608028654);  // sqrt(2 / pi)
}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return fast::GeluForward(out, inp, n);
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(kGeluScale<T> * (x + T(0.044715) * x * x * x)));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return fast::GeluBackward(dinp, inp, dout, n);
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
    const T t = std::tanh(u);
    const T sech2 = T(1) - t * t;
    const T local =
        T(0.5) * (T(1) + t) + T(0.5) * x * sech2 * kGeluScale<T> * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] += local * dout[i];
  }
}

template <typename T>
T SoftmaxCrossEntropyForward(T* probs, const T* logits, const int32_t* targets, int64_t rows,
                             int vocab) {
  T total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * vocab;
    T* p = probs + r * vocab;
    T max = z[0];
    for (int v = 1; v < vocab; ++v) max = std::max(max, z[v]);
    T sum = 0;
    for (int v = 0; v < vocab; ++v) {
      p[v] = std::exp(z[v] - max);
      sum += p[v];
    }
    for (int v = 0; v < vocab; ++v) p[v] /= sum;
    total += -(z[targets[r]] - max - std::log(sum));  // -log softmax, without log(p) underflow
  }
  return total / static_cast<T>(rows);
}

template <typename T>
void SoftmaxCrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, int64_t rows,
                                 int vocab, T dloss) {
  const T scale = dloss / static_cast<T>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < vocab; ++v) {
      const T indicator = v == targets[r] ? T(1) : T(0);
      dlogits[r * vocab + v] += (probs[r * vocab + v] - indicator) * scale;
    }
  }
}

template <typename T>
void SoftmaxCrossEntropyFused(T* logits, T* losses, const int32_t* targets, int64_t rows, int vocab,
                              int valid, T dscale) {
  if constexpr (std::is_same_v<T, float>) {
    return fast::SoftmaxCrossEntropyFused(logits, losses, targets, rows, vocab, valid, dscale);
  }
  const T scale = dscale;
  for (int64_t r = 0; r < rows; ++r) {
    T* z = logits + r * vocab;
    T max = z[0];
    for (int v = 1; v < valid; ++v) max = std::max(max, z[v]);
    T sum = 0;
    for (int v = 0; v < valid; ++v) sum += std::exp(z[v] - max);
    const T log_sum = std::log(sum);
    losses[r] = -(z[targets[r]] - max - log_sum);
    if (scale == T(0)) continue;
    for (int v = 0; v < valid; ++v) z[v] = std::exp(z[v] - max - log_sum) * scale;
    std::fill(z + valid, z + vocab, T(0));
    z[targets[r]] -= scale;
  }
}

// Attention per (batch, head) through GEMMs on strided views of qkv ([Note: the qkv layout]; the
// reference computes the causal upper triangle and masks it, and saves the probabilities; the
// float kernels use the flash-style fast::FlashAttention*, tested against this).
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int batch, int seq, int channels, int heads,
                      int kv_heads) {
  const math::QkvLayout l{heads, kv_heads, channels / heads};
  const int hs = l.hs;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int64_t ld = l.row();
  for (int b = 0; b < batch; ++b) {
    const T* base = qkv + static_cast<int64_t>(b) * seq * ld;
    for (int h = 0; h < heads; ++h) {
      const T* q = base + l.q(h);
      const T* k = base + l.k(h);
      const T* v = base + l.v(h);
      T* a = att + (static_cast<int64_t>(b) * heads + h) * seq * seq;
      // scores [T, T] = q [T, hs] k^T
      Gemm<T>(false, true, seq, seq, hs, q, ld, k, ld, T(0), a, seq);
      for (int t = 0; t < seq; ++t) {
        T* row = a + static_cast<int64_t>(t) * seq;
        T max = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) max = std::max(max, row[t2] * scale);
        T sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] * scale - max);
          sum += row[t2];
        }
        const T inv = T(1) / sum;
        for (int t2 = 0; t2 < seq; ++t2) row[t2] = t2 <= t ? row[t2] * inv : T(0);
      }
      // out [T, hs] (row stride channels) = att [T, T] v [T, hs]
      T* o = out + static_cast<int64_t>(b) * seq * channels + h * hs;
      Gemm<T>(false, false, seq, hs, seq, a, seq, v, ld, T(0), o, channels);
    }
  }
}

// A key/value head's gradient is the sum over its query heads, added in head order into dqkv
// zeroed first.
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int batch, int seq,
                       int channels, int heads, int kv_heads) {
  const math::QkvLayout l{heads, kv_heads, channels / heads};
  const int hs = l.hs;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  const int64_t ld = l.row();
  std::fill_n(dqkv, static_cast<int64_t>(batch) * seq * ld, T(0));
  std::vector<T> datt(static_cast<size_t>(seq) * seq);
  for (int b = 0; b < batch; ++b) {
    const T* base = qkv + static_cast<int64_t>(b) * seq * ld;
    T* dbase = dqkv + static_cast<int64_t>(b) * seq * ld;
    const T* d = dout + static_cast<int64_t>(b) * seq * channels;
    for (int h = 0; h < heads; ++h) {
      const T* q = base + l.q(h);
      const T* k = base + l.k(h);
      const T* v = base + l.v(h);
      const T* a = att + (static_cast<int64_t>(b) * heads + h) * seq * seq;
      const T* dh = d + h * hs;
      // Through out = att v: datt = dout v^T, dv += att^T dout.
      Gemm<T>(false, true, seq, seq, hs, dh, channels, v, ld, T(0), datt.data(), seq);
      Gemm<T>(true, false, seq, hs, seq, a, seq, dh, channels, T(1), dbase + l.v(h), ld);
      // Through the softmax: dscore = att * (datt - sum(att * datt)), zero above the diagonal.
      for (int t = 0; t < seq; ++t) {
        const T* arow = a + static_cast<int64_t>(t) * seq;
        T* drow = datt.data() + static_cast<int64_t>(t) * seq;
        T weighted = 0;
        for (int t2 = 0; t2 <= t; ++t2) weighted += arow[t2] * drow[t2];
        for (int t2 = 0; t2 < seq; ++t2)
          drow[t2] = t2 <= t ? arow[t2] * (drow[t2] - weighted) * scale : T(0);
      }
      // Through score = scale q . k: dq += dscore k, dk += dscore^T q.
      Gemm<T>(false, false, seq, hs, seq, datt.data(), seq, k, ld, T(1), dbase + l.q(h), ld);
      Gemm<T>(true, false, seq, hs, seq, datt.data(), seq, q, ld, T(1), dbase + l.k(h), ld);
    }
  }
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int batch, int seq,
                      int channels, int begin, int count) {
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      const int64_t row = math::EmbeddingRow(tokens[b * seq + t], begin, count);
      const T* te = row >= 0 ? wte + row * channels : nullptr;
      const T* pe = wpe == nullptr ? nullptr : wpe + static_cast<int64_t>(t) * channels;
      T* o = out + (static_cast<int64_t>(b) * seq + t) * channels;
      for (int c = 0; c < channels; ++c) {
        o[c] = (te != nullptr ? te[c] : T(0)) + (pe != nullptr ? pe[c] : T(0));
      }
    }
  }
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int batch, int seq,
                       int channels, int begin, int count) {
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      const T* d = dout + (static_cast<int64_t>(b) * seq + t) * channels;
      const int64_t row = math::EmbeddingRow(tokens[b * seq + t], begin, count);
      if (dwte != nullptr && row >= 0) {
        T* te = dwte + row * channels;
        for (int c = 0; c < channels; ++c) te[c] += d[c];
      }
      if (dwpe != nullptr) {
        T* pe = dwpe + static_cast<int64_t>(t) * channels;
        for (int c = 0; c < channels; ++c) pe[c] += d[c];
      }
    }
  }
}

#define ZR_INSTANTIATE(T)                                                                          \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int64_t, int, int);             \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int, int);    \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int, T);    \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     int64_t, int);                                                \
  template void GeluForward<T>(T*, const T*, int64_t);                                             \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                                  \
  template T SoftmaxCrossEntropyForward<T>(T*, const T*, const int32_t*, int64_t, int);            \
  template void SoftmaxCrossEntropyBackward<T>(T*, const T*, const int32_t*, int64_t, int, T);     \
  template void SoftmaxCrossEntropyFused<T>(T*, T*, const int32_t*, int64_t, int, int, T);         \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int, int);                    \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int, int);   \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int,    \
                                    int);                                                          \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, int, int, int, int, int);

ZR_INSTANTIATE(float)
ZR_INSTANTIATE(double)
#undef ZR_INSTANTIATE

}  // namespace zerort::cpu
