// The LLaMA family's CPU operations (model_ops.h): RMSNorm, rotary embeddings with grouped-query
// heads, SwiGLU. Templated on the element type: double is the readable reference (the gradient
// checks); float, the training path, takes RMSNorm and SwiGLU through the loops below, compiled
// per vector width (ZR_CPU_CLONES) with kernels/model_math.h's element math (the CUDA kernels'
// own, kernels/cuda/llama_ops.cuh) and the row sums in written-out lanes (RowSum), as the GPT
// path's fast_ops.cc does, and the rotary embeddings with model_math.h's angles and turns. Rows
// threaded by ParallelFor, each row computed the same way whatever the thread count, and the weight
// gradient's rows summed in fixed blocks in order (vector_math.h).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/model_math.h"
#include "zerort/kernels/model_ops.h"

namespace zerort::cpu {
namespace {

// The rows of a [batch x seq] pass, threaded: fn(r, cos, sin) with the angles of row r's
// position (cos and sin [hs / 2]): float's as the CUDA kernels compute them ([Note: the rotary
// angles], model_math.h), double's in double (angle = position x inv_freq, kernels/rope.h's),
// each scaled by the rope's attention factor (YaRN's; 1, an exact product, otherwise).
template <typename T, typename F>
void ForEachRotatedRow(int batch, int seq, int head_size, const Rope& rope, F&& fn) {
  const int half = head_size / 2;
  std::vector<T> cos_t(static_cast<size_t>(seq) * half), sin_t(cos_t.size());
  const float scale = RopeCosSinScale(rope);         // the float path's
  const double scale_d = RopeAttentionFactor(rope);  // the double path's
  for (int i = 0; i < half; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      const float inv_freq = RopeFrequency(rope, i, head_size);
      for (int t = 0; t < seq; ++t) {
        const math::CosSin cs =
            math::RopeScaled(math::RopeCosSin(math::RopeAngle(t, inv_freq)), scale);
        cos_t[static_cast<size_t>(t) * half + i] = cs.cos;
        sin_t[static_cast<size_t>(t) * half + i] = cs.sin;
      }
    } else {
      const double inv_freq = RopeInvFreq(rope, i, head_size);
      for (int t = 0; t < seq; ++t) {
        const double angle = t * inv_freq;
        cos_t[static_cast<size_t>(t) * half + i] = static_cast<T>(std::cos(angle) * scale_d);
        sin_t[static_cast<size_t>(t) * half + i] = static_cast<T>(std::sin(angle) * scale_d);
      }
    }
  }
  ParallelFor(int64_t{batch} * seq, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      fn(r, cos_t.data() + (r % seq) * half, sin_t.data() + (r % seq) * half);
    }
  });
}

// A pair (x1, x2) turned by cosine c and sine s: float by model_math.h's functions (the CUDA
// kernels' own), double written out the same way.
template <typename T>
T TurnFirst(T x1, T x2, T c, T s) {
  if constexpr (std::is_same_v<T, float>) return math::RopeTurnFirst(x1, x2, c, s);
  return x1 * c - x2 * s;
}
template <typename T>
T TurnSecond(T x1, T x2, T c, T s) {
  if constexpr (std::is_same_v<T, float>) return math::RopeTurnSecond(x1, x2, c, s);
  return x2 * c + x1 * s;
}

// ---- the float path ---------------------------------------------------------------------------

ZR_CPU_CLONES void RmsNormSpan(float* out, float* rstd, const float* inp, const float* weight,
                               int64_t r0, int64_t r1, int channels, float eps) {
  const float inv_c = math::InverseCount(channels);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    const float s = math::RmsNormRstd(
        RowSum(channels, [x](int c) { return math::RmsNormSquare(x[c]); }), inv_c, eps);
    float* y = out + r * channels;
#pragma omp simd
    for (int c = 0; c < channels; ++c) y[c] = math::RmsNormOut(x[c], s, weight[c]);
    rstd[r] = s;
  }
}

// Rows [r0, r1) of the backward: dinp (+=) row by row (null: skipped), and the rows' partial sums
// of the weight gradient into pw (null: skipped; else overwritten).
ZR_CPU_CLONES void RmsNormBackwardSpan(float* dinp, float* pw, const float* dout, const float* inp,
                                       const float* weight, const float* rstd, int64_t r0,
                                       int64_t r1, int channels) {
  const float inv_c = math::InverseCount(channels);
  if (pw != nullptr) std::fill(pw, pw + channels, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = inp + r * channels;
    const float* dy = dout + r * channels;
    const float s = rstd[r];
    if (dinp != nullptr) {
      const float dot =
          RowSum(channels, [=](int c) { return math::RmsNormDot(dy[c], weight[c], x[c], s); }) *
          inv_c;
      float* dx = dinp + r * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) {
        dx[c] = math::RmsNormInputGrad(dx[c], dy[c], weight[c], x[c], s, dot);
      }
    }
    if (pw != nullptr) {
#pragma omp simd
      for (int c = 0; c < channels; ++c) pw[c] += math::RmsNormWeightGrad(dy[c], x[c], s);
    }
  }
}

// One row of SwiGLU: its `cols` gates and its `cols` ups are each contiguous in both layouts
// (GatedIndex below).
ZR_CPU_CLONES void SwiGluRow(float* out, const float* gate, const float* up, int cols) {
#pragma omp simd
  for (int c = 0; c < cols; ++c) out[c] = math::SwiGlu(gate[c], up[c]);
}

ZR_CPU_CLONES void SwiGluBackwardRow(float* dgate, float* dup, const float* dout, const float* gate,
                                     const float* up, int cols) {
#pragma omp simd
  for (int c = 0; c < cols; ++c) {
    const float s = math::Sigmoid(gate[c]);
    dgate[c] = math::SwiGluGateGrad(dout[c], gate[c], up[c], s);
    dup[c] = math::SwiGluUpGrad(dout[c], gate[c], s);
  }
}

}  // namespace

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t rows, int channels,
                    T eps) {
  if constexpr (std::is_same_v<T, float>) {
    ParallelFor(rows, RowGrain(channels), [&](int64_t r0, int64_t r1) {
      RmsNormSpan(out, rstd, inp, weight, r0, r1, channels, eps);
    });
    return;
  }
  ParallelFor(rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = inp + r * channels;
      T ss = 0;
      for (int c = 0; c < channels; ++c) ss += x[c] * x[c];
      const T s = T(1) / std::sqrt(ss / static_cast<T>(channels) + eps);
      T* y = out + r * channels;
      for (int c = 0; c < channels; ++c) y[c] = x[c] * s * weight[c];
      rstd[r] = s;
    }
  });
}

template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int64_t rows, int channels) {
  // dx = rstd (dn - n mean(dn n)), with n = x rstd and dn = dy weight; dweight += sum dy n.
  // Either gradient may be null: skipped.
  if constexpr (std::is_same_v<T, float>) {
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    std::vector<float> pw(dweight != nullptr ? static_cast<size_t>(blocks) * channels : 0);
    ParallelFor(blocks, RowBlockGrain(channels), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        RmsNormBackwardSpan(dinp, pw.empty() ? nullptr : pw.data() + b * channels, dout, inp,
                            weight, rstd, b * kRowBlock, std::min(rows, (b + 1) * kRowBlock),
                            channels);
      }
    });
    for (int64_t b = 0; dweight != nullptr && b < blocks; ++b) {
      fast::Accumulate(dweight, pw.data() + b * channels, channels);
    }
    return;
  }
  if (dinp != nullptr) {
    ParallelFor(rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* x = inp + r * channels;
        const T* dy = dout + r * channels;
        const T s = rstd[r];
        T dot = 0;
        for (int c = 0; c < channels; ++c) dot += dy[c] * weight[c] * x[c] * s;
        dot /= static_cast<T>(channels);
        T* dx = dinp + r * channels;
        for (int c = 0; c < channels; ++c) dx[c] += s * (dy[c] * weight[c] - x[c] * s * dot);
      }
    });
  }
  if (dweight == nullptr) return;
  // Fixed blocks of rows, summed in order: the same bits at any thread count.
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<T> partial(static_cast<size_t>(blocks) * channels, T(0));
  ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      T* p = partial.data() + b * channels;
      for (int64_t r = b * kRowBlock; r < std::min(rows, (b + 1) * kRowBlock); ++r) {
        for (int c = 0; c < channels; ++c)
          p[c] += dout[r * channels + c] * inp[r * channels + c] * rstd[r];
      }
    }
  });
  for (int64_t b = 0; b < blocks; ++b) {
    for (int c = 0; c < channels; ++c) dweight[c] += partial[b * channels + c];
  }
}

template <typename T>
void RopeQkvInPlace(T* qkv, int batch, int seq, int heads, int kv_heads, int head_size,
                    const Rope& rope, bool transpose) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int half = head_size / 2;
  // The transpose turns by -angle: sin negated.
  const T sign = transpose ? T(-1) : T(1);
  ForEachRotatedRow<T>(batch, seq, head_size, rope, [&](int64_t r, const T* c, const T* s) {
    T* row = qkv + r * l.row();
    // Query heads, then the key heads; the value heads after them are not turned.
    for (int h = 0; h < heads + kv_heads; ++h) {
      T* x = row + int64_t{h} * head_size;
      for (int i = 0; i < half; ++i) {
        const T x1 = x[i], x2 = x[i + half], si = sign * s[i];
        x[i] = TurnFirst(x1, x2, c[i], si);
        x[i + half] = TurnSecond(x1, x2, c[i], si);
      }
    }
  });
}

// q, k and v laid side by side in qkv's layout, then turned in place: one rotation for both.
template <typename T>
void RopeQkvForward(T* qkv, const T* q, const T* k, const T* v, int batch, int seq, int heads,
                    int kv_heads, int head_size, const Rope& rope) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int64_t C = l.q_cols(), KV = l.kv_cols();
  ParallelFor(int64_t{batch} * seq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* out = qkv + r * l.row();
      std::copy(q + r * C, q + (r + 1) * C, out);
      std::copy(k + r * KV, k + (r + 1) * KV, out + C);
      std::copy(v + r * KV, v + (r + 1) * KV, out + C + KV);
    }
  });
  RopeQkvInPlace(qkv, batch, seq, heads, kv_heads, head_size, rope, false);
}

template <typename T>
void RopeQkvBackward(T* dq, T* dk, T* dv, const T* dqkv, int batch, int seq, int heads,
                     int kv_heads, int head_size, const Rope& rope) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int half = head_size / 2;
  const int64_t C = l.q_cols(), KV = l.kv_cols();
  ForEachRotatedRow<T>(batch, seq, head_size, rope, [&](int64_t r, const T* c, const T* s) {
    const T* in = dqkv + r * l.row();
    // The rotation's transpose (the turn by -angle), added.
    auto unrotate = [&](T* dx, const T* dy) {
      for (int i = 0; i < half; ++i) {
        const T y1 = dy[i], y2 = dy[i + half];
        dx[i] += TurnFirst(y1, y2, c[i], -s[i]);
        dx[i + half] += TurnSecond(y1, y2, c[i], -s[i]);
      }
    };
    for (int h = 0; dq != nullptr && h < heads; ++h) {
      unrotate(dq + r * C + h * head_size, in + l.q(h));
    }
    for (int j = 0; dk != nullptr && j < kv_heads; ++j) {
      unrotate(dk + r * KV + j * head_size, in + C + j * head_size);
    }
    if (dv != nullptr) {
      for (int64_t i = 0; i < KV; ++i) dv[r * KV + i] += in[C + KV + i];
    }
  });
}

// Element i of a [rows, cols] output: where its gate is in gate_up (its up is `up` further).
struct GatedIndex {
  int64_t rows;
  int cols;
  bool interleaved;
  int64_t gate(int64_t i) const { return interleaved ? i + (i / cols) * cols : i; }
  int64_t up() const { return interleaved ? cols : rows * cols; }
};

template <typename T>
void SwiGluForward(T* out, const T* gate_up, int64_t rows, int cols, bool interleaved) {
  const GatedIndex at{rows, cols, interleaved};
  if constexpr (std::is_same_v<T, float>) {
    ParallelFor(rows, RowGrain(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = gate_up + at.gate(r * cols);
        SwiGluRow(out + r * cols, g, g + at.up(), cols);
      }
    });
    return;
  }
  ParallelFor(rows * cols, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = at.gate(i);
      const T g = gate_up[j];
      out[i] = g / (T(1) + std::exp(-g)) * gate_up[j + at.up()];
    }
  });
}

template <typename T>
void SwiGluBackward(T* dgate_up, const T* dout, const T* gate_up, int64_t rows, int cols,
                    bool interleaved) {
  const GatedIndex at{rows, cols, interleaved};
  if constexpr (std::is_same_v<T, float>) {
    ParallelFor(rows, RowGrain(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t j = at.gate(r * cols);
        SwiGluBackwardRow(dgate_up + j, dgate_up + j + at.up(), dout + r * cols, gate_up + j,
                          gate_up + j + at.up(), cols);
      }
    });
    return;
  }
  // silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
  ParallelFor(rows * cols, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = at.gate(i);
      const T g = gate_up[j];
      const T s = T(1) / (T(1) + std::exp(-g));
      dgate_up[j] = dout[i] * gate_up[j + at.up()] * s * (T(1) + g * (T(1) - s));
      dgate_up[j + at.up()] = dout[i] * g * s;
    }
  });
}

#define ZR_INSTANTIATE_LLAMA(T)                                                                   \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int64_t, int, T);                   \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int); \
  template void RopeQkvForward<T>(T*, const T*, const T*, const T*, int, int, int, int, int,      \
                                  const Rope&);                                                   \
  template void RopeQkvBackward<T>(T*, T*, T*, const T*, int, int, int, int, int, const Rope&);   \
  template void RopeQkvInPlace<T>(T*, int, int, int, int, int, const Rope&, bool);                \
  template void SwiGluForward<T>(T*, const T*, int64_t, int, bool);                               \
  template void SwiGluBackward<T>(T*, const T*, const T*, int64_t, int, bool);
ZR_INSTANTIATE_LLAMA(float)
ZR_INSTANTIATE_LLAMA(double)
#undef ZR_INSTANTIATE_LLAMA

}  // namespace zerort::cpu
