// The float path of the GPT model's CPU operations (fast_ops.h): hot loops compiled per vector
// width (ZR_CPU_CLONES) and threaded by ParallelFor (vector_math.h).
#include "kernels/cpu/fast_ops.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace zerort::cpu::fast {
namespace {

constexpr int64_t kElementGrain = int64_t{1} << 14;  // elements per thread, at least
constexpr float kGeluScale = 0.7978845608028654f;    // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Rows per thread so that each gets at least kElementGrain elements.
int64_t RowGrain(int cols) { return std::max<int64_t>(1, kElementGrain / std::max(cols, 1)); }

ZR_CPU_CLONES void FillRowsSpan(float* out, const float* bias, int64_t r0, int64_t r1, int cols) {
  for (int64_t r = r0; r < r1; ++r) {
    float* o = out + r * cols;
    if (bias == nullptr) {
      std::fill(o, o + cols, 0.0f);
    } else {
      std::copy(bias, bias + cols, o);
    }
  }
}

// partial[c] = sum over rows [r0, r1) of m[r, c] (one block's share of a column sum).
ZR_CPU_CLONES void ColumnSumSpan(float* partial, const float* m, int64_t r0, int64_t r1, int cols) {
  std::fill(partial, partial + cols, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = m + r * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) partial[c] += row[c];
  }
}

ZR_CPU_CLONES void AddInto(float* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

ZR_CPU_CLONES void SumSpan(float* out, const float* a, const float* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Adds the blocks' partial sums into `dst`, block 0 first.
void SumBlocks(float* dst, const std::vector<float>& partials, int64_t blocks, int cols) {
  for (int64_t b = 0; b < blocks; ++b) AddInto(dst, partials.data() + b * cols, cols);
}

ZR_CPU_CLONES void LayerNormSpan(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int64_t r0, int64_t r1,
                                 int channels, float eps) {
  const float inv_c = 1.0f / static_cast<float>(channels);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < channels; ++c) m += x[c];
    m *= inv_c;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < channels; ++c) v += (x[c] - m) * (x[c] - m);
    v *= inv_c;
    const float s = 1.0f / std::sqrt(v + eps);
    float* o = out + r * channels;
#pragma omp simd
    for (int c = 0; c < channels; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

// One block of rows of the LayerNorm backward: dinp (+=) row by row, and the block's partial
// sums of the weight and bias gradients (pw, pb: null when not wanted).
ZR_CPU_CLONES void LayerNormBackwardSpan(float* dinp, float* pw, float* pb, const float* dout,
                                         const float* inp, const float* weight, const float* mean,
                                         const float* rstd, int64_t r0, int64_t r1, int channels) {
  const float inv_c = 1.0f / static_cast<float>(channels);
  if (pw != nullptr) std::fill(pw, pw + channels, 0.0f);
  if (pb != nullptr) std::fill(pb, pb + channels, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    const float* dy = dout + r * channels;
    const float m = mean[r], s = rstd[r];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < channels; ++c) {
      const float dnorm = dy[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * (x[c] - m) * s;
    }
    dnorm_mean *= inv_c;
    dnorm_norm_mean *= inv_c;
    if (dinp != nullptr) {
      float* dx = dinp + r * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) {
        const float norm = (x[c] - m) * s;
        dx[c] += (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
    if (pw != nullptr) {
#pragma omp simd
      for (int c = 0; c < channels; ++c) pw[c] += (x[c] - m) * s * dy[c];
    }
    if (pb != nullptr) AddInto(pb, dy, channels);
  }
}

ZR_CPU_CLONES void GeluSpan(float* out, const float* inp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // 0.5 x (1 + tanh u) = x sigmoid(2u) = x / (1 + e^(-2u))
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = x / (1.0f + FastExp(-2.0f * u));
  }
}

ZR_CPU_CLONES void GeluBackwardSpan(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // With s = sigmoid(2u): tanh u = 2s - 1 and sech^2 u = 4 s (1 - s), so
    // d/dx = 0.5 (1 + tanh u) + 0.5 x sech^2 u du/dx = s + 2 x s (1 - s) du/dx.
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float sg = 1.0f / (1.0f + FastExp(-2.0f * u));
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += (sg + 2.0f * x * sg * (1.0f - sg) * du) * dout[i];
  }
}

ZR_CPU_CLONES void CrossEntropySpan(float* logits, float* losses, const int32_t* targets,
                                    int64_t r0, int64_t r1, int vocab, float dloss, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    float* z = logits + r * vocab;
    float max = z[0];
#pragma omp simd reduction(max : max)
    for (int v = 1; v < vocab; ++v) max = std::max(max, z[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < vocab; ++v) sum += FastExp(z[v] - max);
    const float log_sum = std::log(sum);
    losses[r] = -(z[targets[r]] - max - log_sum);
    if (dloss == 0.0f) continue;
    const float shift = max + log_sum;
#pragma omp simd
    for (int v = 0; v < vocab; ++v) z[v] = FastExp(z[v] - shift) * scale;
    z[targets[r]] -= scale;
  }
}

// Causal softmax of rows [q0, q1) of one head's scores (row stride seq; keys [0, q1) computed):
// probabilities for keys <= t, zeros after (to the end of the row: the saved att).
ZR_CPU_CLONES void CausalSoftmaxRows(float* a, int q0, int q1, int seq, float scale) {
  for (int t = q0; t < q1; ++t) {
    float* row = a + static_cast<int64_t>(t) * seq;
    float max = -INFINITY;
#pragma omp simd reduction(max : max)
    for (int t2 = 0; t2 <= t; ++t2) max = std::max(max, row[t2] * scale);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; ++t2) {
      row[t2] = FastExp(row[t2] * scale - max);
      sum += row[t2];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
    std::fill(row + t + 1, row + seq, 0.0f);
  }
}

// Rows [q0, q1) of the softmax's backward in place on a block of datt (its row 0 is query q0;
// row stride seq): keys <= t get att * (datt - sum(att * datt)) * scale, keys in (t, q1) zero.
ZR_CPU_CLONES void CausalSoftmaxBackwardRows(float* dblock, const float* att, int q0, int q1,
                                             int seq, float scale) {
  for (int t = q0; t < q1; ++t) {
    const float* arow = att + static_cast<int64_t>(t) * seq;
    float* drow = dblock + static_cast<int64_t>(t - q0) * seq;
    float weighted = 0.0f;
#pragma omp simd reduction(+ : weighted)
    for (int t2 = 0; t2 <= t; ++t2) weighted += arow[t2] * drow[t2];
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - weighted) * scale;
    std::fill(drow + t + 1, drow + q1, 0.0f);
  }
}

constexpr int kQueryBlock = 64;

void Sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

// Over (batch, head) pairs: threaded when OpenBLAS shares the OpenMP pool (its GEMMs inside a
// parallel region then run on the calling thread); with another OpenBLAS build one pair at a
// time, each GEMM threaded by OpenBLAS. Either way each pair's arithmetic is the same.
template <typename F>
void ForEachHead(int pairs, F&& f) {
  if (openblas_get_parallel() == 2) {
    ParallelFor(pairs, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) f(static_cast<int>(p));
    });
  } else {
    for (int p = 0; p < pairs; ++p) f(p);
  }
}

}  // namespace

void FillRows(float* out, const float* bias, int64_t rows, int cols) {
  ParallelFor(rows, RowGrain(cols),
              [&](int64_t r0, int64_t r1) { FillRowsSpan(out, bias, r0, r1, cols); });
}

void AddColumnSums(float* dbias, const float* dout, int64_t rows, int cols) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partials(static_cast<size_t>(blocks) * cols);
  ParallelFor(blocks, std::max<int64_t>(1, RowGrain(cols) / kRowBlock),
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  ColumnSumSpan(partials.data() + b * cols, dout, b * kRowBlock,
                                std::min(rows, (b + 1) * kRowBlock), cols);
                }
              });
  SumBlocks(dbias, partials, blocks, cols);
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int64_t rows, int channels, float eps) {
  ParallelFor(rows, RowGrain(channels), [&](int64_t r0, int64_t r1) {
    LayerNormSpan(out, mean, rstd, inp, weight, bias, r0, r1, channels, eps);
  });
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t rows, int channels) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> pw(dweight != nullptr ? static_cast<size_t>(blocks) * channels : 0);
  std::vector<float> pb(dbias != nullptr ? static_cast<size_t>(blocks) * channels : 0);
  ParallelFor(blocks, std::max<int64_t>(1, RowGrain(channels) / kRowBlock),
              [&](int64_t b0, int64_t b1) {
                for (int64_t b = b0; b < b1; ++b) {
                  LayerNormBackwardSpan(dinp, pw.empty() ? nullptr : pw.data() + b * channels,
                                        pb.empty() ? nullptr : pb.data() + b * channels, dout, inp,
                                        weight, mean, rstd, b * kRowBlock,
                                        std::min(rows, (b + 1) * kRowBlock), channels);
                }
              });
  if (dweight != nullptr) SumBlocks(dweight, pw, blocks, channels);
  if (dbias != nullptr) SumBlocks(dbias, pb, blocks, channels);
}

void GeluForward(float* out, const float* inp, int64_t n) {
  ParallelFor(n, kElementGrain,
              [&](int64_t i0, int64_t i1) { GeluSpan(out + i0, inp + i0, i1 - i0); });
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  ParallelFor(n, kElementGrain, [&](int64_t i0, int64_t i1) {
    GeluBackwardSpan(dinp + i0, inp + i0, dout + i0, i1 - i0);
  });
}

void SoftmaxCrossEntropyFused(float* logits, float* losses, const int32_t* targets, int64_t rows,
                              int vocab, float dloss) {
  const float scale = dloss / static_cast<float>(rows);
  ParallelFor(rows, RowGrain(vocab), [&](int64_t r0, int64_t r1) {
    CrossEntropySpan(logits, losses, targets, r0, r1, vocab, dloss, scale);
  });
}

void AttentionForward(float* out, float* att, const float* qkv, int batch, int seq, int channels,
                      int heads) {
  const int hs = channels / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t c3 = 3 * static_cast<int64_t>(channels);
  ForEachHead(batch * heads, [&](int pair) {
    const int b = pair / heads, h = pair % heads;
    const float* base = qkv + static_cast<int64_t>(b) * seq * c3;
    const float* q = base + h * hs;
    const float* k = base + channels + h * hs;
    const float* v = base + 2 * channels + h * hs;
    float* a = att + static_cast<int64_t>(pair) * seq * seq;
    float* o = out + static_cast<int64_t>(b) * seq * channels + h * hs;
    for (int q0 = 0; q0 < seq; q0 += kQueryBlock) {
      const int q1 = std::min(seq, q0 + kQueryBlock);
      float* block = a + static_cast<int64_t>(q0) * seq;
      // scores [q0, q1) x [0, q1) = q k^T; then the causal softmax; then out = att v.
      Sgemm(false, true, q1 - q0, q1, hs, q + q0 * c3, c3, k, c3, 0.0f, block, seq);
      CausalSoftmaxRows(a, q0, q1, seq, scale);
      Sgemm(false, false, q1 - q0, hs, q1, block, seq, v, c3, 0.0f,
            o + static_cast<int64_t>(q0) * channels, channels);
    }
  });
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att,
                       int batch, int seq, int channels, int heads) {
  const int hs = channels / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t c3 = 3 * static_cast<int64_t>(channels);
  ForEachHead(batch * heads, [&](int pair) {
    const int b = pair / heads, h = pair % heads;
    const float* base = qkv + static_cast<int64_t>(b) * seq * c3;
    float* dbase = dqkv + static_cast<int64_t>(b) * seq * c3;
    const float* q = base + h * hs;
    const float* k = base + channels + h * hs;
    const float* v = base + 2 * channels + h * hs;
    float* dq = dbase + h * hs;
    float* dk = dbase + channels + h * hs;
    float* dv = dbase + 2 * channels + h * hs;
    const float* a = att + static_cast<int64_t>(pair) * seq * seq;
    const float* dh = dout + static_cast<int64_t>(b) * seq * channels + h * hs;
    std::vector<float> datt(static_cast<size_t>(kQueryBlock) * seq);
    for (int q0 = 0; q0 < seq; q0 += kQueryBlock) {
      const int q1 = std::min(seq, q0 + kQueryBlock), m = q1 - q0;
      const float* ablock = a + static_cast<int64_t>(q0) * seq;
      const float* dblock = dh + static_cast<int64_t>(q0) * channels;
      // Through out = att v: datt = dout v^T, dv += att^T dout.
      Sgemm(false, true, m, q1, hs, dblock, channels, v, c3, 0.0f, datt.data(), seq);
      Sgemm(true, false, q1, hs, m, ablock, seq, dblock, channels, 1.0f, dv, c3);
      // Through the softmax, then score = scale q . k: dq += dscore k, dk += dscore^T q.
      CausalSoftmaxBackwardRows(datt.data(), a, q0, q1, seq, scale);
      Sgemm(false, false, m, hs, q1, datt.data(), seq, k, c3, 1.0f, dq + q0 * c3, c3);
      Sgemm(true, false, q1, hs, m, datt.data(), seq, q + q0 * c3, c3, 1.0f, dk, c3);
    }
  });
}

void Add(float* out, const float* a, const float* b, int64_t n) {
  ParallelFor(n, kElementGrain,
              [&](int64_t i0, int64_t i1) { SumSpan(out + i0, a + i0, b + i0, i1 - i0); });
}

void Accumulate(float* dst, const float* src, int64_t n) {
  ParallelFor(n, kElementGrain,
              [&](int64_t i0, int64_t i1) { AddInto(dst + i0, src + i0, i1 - i0); });
}

}  // namespace zerort::cpu::fast
