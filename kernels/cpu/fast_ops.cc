// The float path of the GPT model's CPU operations (fast_ops.h): hot loops compiled per vector
// width (ZR_CPU_CLONES) and threaded by ParallelFor (vector_math.h).
#include "zerort/kernels/cpu/fast_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "zerort/kernels/blas.h"
#include "zerort/kernels/cpu/sgemm.h"
#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/model_math.h"
#include "zerort/runtime/float_bits.h"
#include "zerort/runtime/status.h"

namespace zerort::cpu::fast {
namespace {

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
  const float inv_c = math::InverseCount(channels);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    const float m = RowSum(channels, [x](int c) { return x[c]; }) * inv_c;
    const float v = RowSum(channels, [x, m](int c) { return math::SquaredDeviation(x[c], m); });
    const float s = math::LayerNormRstd(v, inv_c, eps);
    float* o = out + r * channels;
#pragma omp simd
    for (int c = 0; c < channels; ++c) o[c] = math::LayerNormOut(x[c], m, s, weight[c], bias[c]);
    mean[r] = m;
    rstd[r] = s;
  }
}

// Rows [r0, r1) of the residual add and the LayerNorm that follows it: sum = a + b, out =
// LayerNorm(sum), row by row (sum may be a or b). The same arithmetic as Add then LayerNorm.
ZR_CPU_CLONES void AddLayerNormSpan(float* sum, float* out, float* mean, float* rstd,
                                    const float* a, const float* b, const float* weight,
                                    const float* bias, int64_t r0, int64_t r1, int channels,
                                    float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * channels;
    SumSpan(sum + o, a + o, b + o, channels);
    LayerNormSpan(out, mean, rstd, sum, weight, bias, r, r + 1, channels, eps);
  }
}

// One block of rows of the LayerNorm backward: dinp (+=) row by row, and the block's partial
// sums of the weight and bias gradients (pw, pb: null when not wanted).
ZR_CPU_CLONES void LayerNormBackwardSpan(float* dinp, float* pw, float* pb, const float* dout,
                                         const float* inp, const float* weight, const float* mean,
                                         const float* rstd, int64_t r0, int64_t r1, int channels) {
  const float inv_c = math::InverseCount(channels);
  if (pw != nullptr) std::fill(pw, pw + channels, 0.0f);
  if (pb != nullptr) std::fill(pb, pb + channels, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    const float* dy = dout + r * channels;
    const float m = mean[r], s = rstd[r];
    auto [dnorm_mean, dnorm_norm_mean] = RowSums(channels, [=](int c) {
      const float dnorm = math::LayerNormDnorm(dy[c], weight[c]);
      return std::pair<float, float>(dnorm, math::LayerNormDnormNorm(dnorm, x[c], m, s));
    });
    dnorm_mean *= inv_c;
    dnorm_norm_mean *= inv_c;
    if (dinp != nullptr && pw != nullptr && pb != nullptr) {  // the usual case: one more pass
      float* dx = dinp + r * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) {
        dx[c] +=
            math::LayerNormInputGrad(dy[c], weight[c], x[c], m, s, dnorm_mean, dnorm_norm_mean);
        pw[c] += math::LayerNormWeightGrad(x[c], m, s, dy[c]);
        pb[c] += dy[c];
      }
      continue;
    }
    if (dinp != nullptr) {
      float* dx = dinp + r * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) {
        dx[c] +=
            math::LayerNormInputGrad(dy[c], weight[c], x[c], m, s, dnorm_mean, dnorm_norm_mean);
      }
    }
    if (pw != nullptr) {
#pragma omp simd
      for (int c = 0; c < channels; ++c) pw[c] += math::LayerNormWeightGrad(x[c], m, s, dy[c]);
    }
    if (pb != nullptr) AddInto(pb, dy, channels);
  }
}

ZR_CPU_CLONES void GeluSpan(float* out, const float* inp, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = math::Gelu(inp[i]);
}

// Rows [r0, r1) of the MLP's first-layer epilogue: pre[r, :] += bias, out[r, :] = gelu(pre[r, :]),
// each row while it is in cache.
ZR_CPU_CLONES void BiasGeluSpan(float* pre, float* out, const float* bias, int64_t r0, int64_t r1,
                                int cols) {
  for (int64_t r = r0; r < r1; ++r) {
    float* p = pre + r * cols;
    if (bias != nullptr) AddInto(p, bias, cols);
    GeluSpan(out + r * cols, p, cols);
  }
}

ZR_CPU_CLONES void GeluBackwardSpan(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dinp[i] = math::GeluBackward(dinp[i], inp[i], dout[i]);
}

// A row of `vocab` logits, the first `valid` of them the vocabulary (the rest padding: not counted,
// gradient 0).
ZR_CPU_CLONES void CrossEntropySpan(float* logits, float* losses, const int32_t* targets,
                                    int64_t r0, int64_t r1, int vocab, int valid, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    float* z = logits + r * vocab;
    float max = z[0];
#pragma omp simd reduction(max : max)
    for (int v = 1; v < valid; ++v) max = std::max(max, z[v]);
    const float sum = RowSum(valid, [z, max](int v) { return FastExp(z[v] - max); });
    const float log_sum = std::log(sum);
    losses[r] = math::CrossEntropyLoss(z[targets[r]], max, log_sum);
    if (scale == 0.0f) continue;
    const float shift = max + log_sum;
#pragma omp simd
    for (int v = 0; v < valid; ++v) z[v] = math::CrossEntropyGrad(z[v], shift, scale);
    std::fill(z + valid, z + vocab, 0.0f);
    z[targets[r]] = math::CrossEntropyTargetGrad(z[targets[r]], scale);
  }
}

// One key block of the flash forward for a block of m queries (query q0 + i, keys k0 + j),
// [Note: flash attention's tiles] (kernels/flash_math.h): s [m, kn] (row stride ld) holds q k^T;
// keys after the query are masked. Each row's online softmax sm[i] is rescaled with its
// accumulator acc [m, hs], and s overwritten by the block's unnormalised probabilities, which
// the caller multiplies by v.
ZR_CPU_CLONES void FlashForwardBlock(float* s, int ld, int m, int kn, int q0, int k0, float scale,
                                     math::OnlineSoftmax* sm, float* acc, int hs) {
  for (int i = 0; i < m; ++i) {
    float* row = s + static_cast<int64_t>(i) * ld;
    const int valid = math::CausalKeys(q0 + i, k0, kn);  // the diagonal block: at least one
    float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
    for (int j = 0; j < valid; ++j)
      block_max = std::max(block_max, math::ScaledScore(row[j], scale));
    const float alpha = sm[i].Rescale(block_max);
    const math::OnlineSoftmax soft = sm[i];  // a copy: the stores to row cannot change it
    const float sum =
        RowSum(valid, [=](int j) { return row[j] = soft.Prob(math::ScaledScore(row[j], scale)); });
    std::fill(row + valid, row + kn, 0.0f);
    sm[i].Accumulate(sum);
    float* a = acc + static_cast<int64_t>(i) * hs;
#pragma omp simd
    for (int c = 0; c < hs; ++c) a[c] *= alpha;
  }
}

// The flash backward's probabilities and score gradients for one (query block, key block):
// p [m, kn] holds q k^T on entry and exp(score - lse) (masked: 0) on exit; dp holds dout v^T on
// entry and p * (dp - D) * scale on exit (D: each query's dout . out).
ZR_CPU_CLONES void FlashBackwardBlock(float* p, float* dp, int ld, int m, int kn, int q0, int k0,
                                      float scale, const float* lse, const float* d) {
  for (int i = 0; i < m; ++i) {
    float* prow = p + static_cast<int64_t>(i) * ld;
    float* drow = dp + static_cast<int64_t>(i) * ld;
    const int valid = math::CausalKeys(q0 + i, k0, kn);
    const float c2 = math::Base2(scale), shift = math::Base2(lse[q0 + i]), di = d[q0 + i];
#pragma omp simd
    for (int j = 0; j < valid; ++j) {
      prow[j] = math::FastExp2(math::ProbExponent2(prow[j], c2, shift));
      drow[j] = math::ScoreGrad(prow[j], drow[j], di, scale);
    }
    std::fill(prow + valid, prow + kn, 0.0f);
    std::fill(drow + valid, drow + kn, 0.0f);
  }
}

// The block's m x kn values rounded to the element type the CUDA kernels' products read
// (FlashAttentionForward's `products`), in place.
void RoundForProducts(float* s, int ld, int m, int kn, DType products) {
  ZR_CHECK(products == DType::kF32 || products == DType::kBF16 || products == DType::kF16)
      << "flash attention's products in " << DTypeName(products);
  if (products == DType::kF32) return;
  for (int i = 0; i < m; ++i) {
    float* row = s + static_cast<int64_t>(i) * ld;
    if (products == DType::kBF16) {
      for (int j = 0; j < kn; ++j) row[j] = Bf16BitsToFloat(FloatToBf16Bits(row[j]));
    } else {
      for (int j = 0; j < kn; ++j) row[j] = F16BitsToFloat(FloatToF16Bits(row[j]));
    }
  }
}

// out row = acc / l; lse = max + log l.
ZR_CPU_CLONES void FlashFinish(float* o, int64_t ldo, float* lse, const float* acc,
                               const math::OnlineSoftmax* sm, int m, int hs) {
  for (int i = 0; i < m; ++i) {
    const float inv = sm[i].Inverse();
    const float* a = acc + static_cast<int64_t>(i) * hs;
    float* out = o + i * ldo;
#pragma omp simd
    for (int c = 0; c < hs; ++c) out[c] = a[c] * inv;
    lse[i] = sm[i].Lse();
  }
}

// D[t] = dout[t] . out[t] over one head's channels.
ZR_CPU_CLONES void RowDots(float* d, const float* dout, const float* out, int64_t ld, int seq,
                           int hs) {
  for (int t = 0; t < seq; ++t) {
    const float* a = dout + t * ld;
    const float* b = out + t * ld;
    d[t] = RowSum(hs, [a, b](int c) { return a[c] * b[c]; });
  }
}

constexpr int kBlock = 64;  // queries and keys per tile (equal: each tile row has a key)

// One (batch, head) pair's place in the fused layouts: qkv [batch, seq, 3 x channels] (this
// head's Q at Qkv(pair), K and V channels and 2 x channels further) and out [batch, seq, channels].
struct Heads {
  Heads(int seq, int channels, int heads, int kv_heads)
      : seq(seq),
        channels(channels),
        heads(heads),
        hs(channels / heads),
        l{heads, kv_heads, channels / heads},
        ld(l.row()),
        scale(1.0f / std::sqrt(static_cast<float>(channels / heads))) {}
  int64_t Row(int pair) const { return static_cast<int64_t>(pair / heads) * seq * ld; }
  int64_t Out(int pair) const {
    return static_cast<int64_t>(pair / heads) * seq * channels + (pair % heads) * hs;
  }
  // This pair's Q and its group's K and V in a qkv-shaped buffer (the input, or its gradient):
  // [Note: the qkv layout], each row `ld` apart.
  template <typename T>
  std::array<T*, 3> QkvOf(T* base, int pair) const {
    T* row = base + Row(pair);
    const int h = pair % heads;
    return {row + l.q(h), row + l.k(h), row + l.v(h)};
  }
  int seq, channels, heads, hs;
  math::QkvLayout l;
  int64_t ld;
  float scale;
};

// Over (batch, head) pairs: threaded when the GEMM library shares the OpenMP pool (its GEMMs
// inside a parallel region then run on the calling thread); with OpenBLAS's pthreads build one
// pair at a time, each GEMM threaded by OpenBLAS. Either way each pair's arithmetic is the same.
template <typename F>
void ForEachHead(int pairs, F&& f) {
  if (SgemmSharesOpenMpPool()) {
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
  ParallelFor(blocks, RowBlockGrain(cols), [&](int64_t b0, int64_t b1) {
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

void AddLayerNormForward(float* sum, float* out, float* mean, float* rstd, const float* a,
                         const float* b, const float* weight, const float* bias, int64_t rows,
                         int channels, float eps) {
  ParallelFor(rows, RowGrain(channels), [&](int64_t r0, int64_t r1) {
    AddLayerNormSpan(sum, out, mean, rstd, a, b, weight, bias, r0, r1, channels, eps);
  });
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int64_t rows, int channels) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> pw(dweight != nullptr ? static_cast<size_t>(blocks) * channels : 0);
  std::vector<float> pb(dbias != nullptr ? static_cast<size_t>(blocks) * channels : 0);
  ParallelFor(blocks, RowBlockGrain(channels), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      LayerNormBackwardSpan(dinp, pw.empty() ? nullptr : pw.data() + b * channels,
                            pb.empty() ? nullptr : pb.data() + b * channels, dout, inp, weight,
                            mean, rstd, b * kRowBlock, std::min(rows, (b + 1) * kRowBlock),
                            channels);
    }
  });
  if (dweight != nullptr) SumBlocks(dweight, pw, blocks, channels);
  if (dbias != nullptr) SumBlocks(dbias, pb, blocks, channels);
}

void GeluForward(float* out, const float* inp, int64_t n) {
  ParallelFor(n, kElementGrain,
              [&](int64_t i0, int64_t i1) { GeluSpan(out + i0, inp + i0, i1 - i0); });
}

void BiasGelu(float* pre, float* out, const float* bias, int64_t rows, int cols) {
  ParallelFor(rows, RowGrain(cols),
              [&](int64_t r0, int64_t r1) { BiasGeluSpan(pre, out, bias, r0, r1, cols); });
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  ParallelFor(n, kElementGrain, [&](int64_t i0, int64_t i1) {
    GeluBackwardSpan(dinp + i0, inp + i0, dout + i0, i1 - i0);
  });
}

void SoftmaxCrossEntropyFused(float* logits, float* losses, const int32_t* targets, int64_t rows,
                              int vocab, int valid, float dscale) {
  ParallelFor(rows, RowGrain(vocab), [&](int64_t r0, int64_t r1) {
    CrossEntropySpan(logits, losses, targets, r0, r1, vocab, valid, dscale);
  });
}

void FlashAttentionForward(float* out, float* lse, const float* qkv, int batch, int seq,
                           int channels, int heads, int kv_heads, DType products) {
  const Heads g(seq, channels, heads, kv_heads);
  const int hs = g.hs;
  const int64_t c3 = g.ld;
  ForEachHead(batch * heads, [&](int pair) {
    const auto [q, k, v] = g.QkvOf(qkv, pair);
    float* o = out + g.Out(pair);
    float* pair_lse = lse + static_cast<int64_t>(pair) * seq;
    std::vector<float> s(kBlock * kBlock), acc(static_cast<size_t>(kBlock) * hs);
    std::vector<math::OnlineSoftmax> sm(kBlock);
    for (int q0 = 0; q0 < seq; q0 += kBlock) {
      const int m = std::min(seq, q0 + kBlock) - q0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(sm.begin(), sm.end(), math::OnlineSoftmax{});
      for (int k0 = 0; k0 <= q0; k0 += kBlock) {  // key tiles up to the diagonal one
        const int kn = std::min(seq, k0 + kBlock) - k0;
        Sgemm(false, true, m, kn, hs, q + q0 * c3, c3, k + k0 * c3, c3, 0.0f, s.data(), kBlock);
        FlashForwardBlock(s.data(), kBlock, m, kn, q0, k0, g.scale, sm.data(), acc.data(), hs);
        RoundForProducts(s.data(), kBlock, m, kn, products);
        Sgemm(false, false, m, hs, kn, s.data(), kBlock, v + k0 * c3, c3, 1.0f, acc.data(), hs);
      }
      FlashFinish(o + static_cast<int64_t>(q0) * channels, channels, pair_lse + q0, acc.data(),
                  sm.data(), m, hs);
    }
  });
}

void FlashAttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int batch, int seq, int channels, int heads,
                            int kv_heads, DType products) {
  const Heads g(seq, channels, heads, kv_heads);
  const int hs = g.hs;
  const int64_t c3 = g.ld;
  // One task per (batch, key/value head): its query heads in order, so that each adds into the
  // shared dK and dV alone, the same way whatever the thread count. dqkv is written: each task
  // first zeroes its own columns (its query heads' dQ, its dK and dV), then adds into them.
  const int group = g.l.group();
  ForEachHead(batch * kv_heads, [&](int kv_pair) {
    std::vector<float> d(seq), p(kBlock * kBlock), dp(kBlock * kBlock);
    const int first = (kv_pair / kv_heads) * heads + (kv_pair % kv_heads) * group;
    for (int t = 0; t < seq; ++t) {
      const auto [dq, dk, dv] = g.QkvOf(dqkv + t * c3, first);
      std::fill_n(dq, static_cast<int64_t>(group) * hs, 0.0f);  // the group's query heads
      std::fill_n(dk, hs, 0.0f);
      std::fill_n(dv, hs, 0.0f);
    }
    for (int pair = first; pair < first + group; ++pair) {
      const auto [q, k, v] = g.QkvOf(qkv, pair);
      const auto [dq, dk, dv] = g.QkvOf(dqkv, pair);
      const int64_t head_off = g.Out(pair);
      const float* dh = dout + head_off;
      const float* pair_lse = lse + static_cast<int64_t>(pair) * seq;
      RowDots(d.data(), dh, out + head_off, channels, seq, hs);
      for (int q0 = 0; q0 < seq; q0 += kBlock) {
        const int m = std::min(seq, q0 + kBlock) - q0;
        const float* dblock = dh + static_cast<int64_t>(q0) * channels;
        for (int k0 = 0; k0 <= q0; k0 += kBlock) {
          const int kn = std::min(seq, k0 + kBlock) - k0;
          // Recompute the probabilities from q k^T and the saved log-sum-exp; dp = dout v^T.
          Sgemm(false, true, m, kn, hs, q + q0 * c3, c3, k + k0 * c3, c3, 0.0f, p.data(), kBlock);
          Sgemm(false, true, m, kn, hs, dblock, channels, v + k0 * c3, c3, 0.0f, dp.data(), kBlock);
          FlashBackwardBlock(p.data(), dp.data(), kBlock, m, kn, q0, k0, g.scale, pair_lse,
                             d.data());
          RoundForProducts(p.data(), kBlock, m, kn, products);
          RoundForProducts(dp.data(), kBlock, m, kn, products);
          // dv += p^T dout; dq += dscore k; dk += dscore^T q.
          Sgemm(true, false, kn, hs, m, p.data(), kBlock, dblock, channels, 1.0f, dv + k0 * c3, c3);
          Sgemm(false, false, m, hs, kn, dp.data(), kBlock, k + k0 * c3, c3, 1.0f, dq + q0 * c3,
                c3);
          Sgemm(true, false, kn, hs, m, dp.data(), kBlock, q + q0 * c3, c3, 1.0f, dk + k0 * c3, c3);
        }
      }
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

namespace zerort {

// The loader's pick among a ZR_CPU_CLONES function's versions: GCC's resolver takes the first of
// x86-64-v4, x86-64-v3 and the default that __builtin_cpu_supports accepts, so the same test here
// names the same version.
std::string CpuLoopLevel() {
#if ZR_CPU_CLONES_BUILT
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "AVX-512 (x86-64-v4)";
  if (__builtin_cpu_supports("x86-64-v3")) return "AVX2 + FMA (x86-64-v3)";
  return "baseline x86-64";
#else
  return "baseline (the per-width versions are not built: ZR_CPU_DISPATCH=OFF)";
#endif
}

}  // namespace zerort
