// The CUDA twins of the LLaMA family's operations (kernels/cpu/llama_ops.cc; ModelKernels
// documents each): RMSNorm (a warp per row; the weight gradient by the column kernels'
// deterministic phases), rotary embeddings with grouped-query heads and SwiGLU (grid-stride
// element loops). Internal to kernels/cuda/, included by model_kernels.cu after model_ops.cuh.
// fp32 arithmetic; the angles in fp32 from kernels/rope.h's inv_freq (theta^(-2i / hs) unscaled,
// like Hugging Face's).
#pragma once

#include "zerort/kernels/cuda/model_ops.cuh"
#include "zerort/kernels/rope.h"

namespace zerort {
namespace {

template <typename T>
static __global__ void RmsNormKernel(T* out, float* rstd, const T* inp, const T* w, int64_t rows,
                                     int channels, float eps) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  float ss = 0.0f;
  for (int c = lane; c < channels; c += 32) ss += ToFloat(x[c]) * ToFloat(x[c]);
  const float s = rsqrtf(WarpSum(ss) / static_cast<float>(channels) + eps);
  for (int c = lane; c < channels; c += 32) {
    out[row * channels + c] = FromFloat<T>(ToFloat(x[c]) * s * ToFloat(w[c]));
  }
  if (lane == 0) rstd[row] = s;
}

// dinp += rstd (dn - n mean(dn n)), n = x rstd, dn = dy w: a warp per row.
template <typename T>
static __global__ void RmsNormInputGradKernel(T* dinp, const T* dout, const T* inp, const T* w,
                                              const float* rstd, int64_t rows, int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  const T* dy = dout + row * channels;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    dot += ToFloat(dy[c]) * ToFloat(w[c]) * ToFloat(x[c]) * s;
  }
  dot = WarpSum(dot) / static_cast<float>(channels);
  for (int c = lane; c < channels; c += 32) {
    T* d = dinp + row * channels + c;
    const float xc = ToFloat(x[c]);
    *d = FromFloat<T>(ToFloat(*d) + s * (ToFloat(dy[c]) * ToFloat(w[c]) - xc * s * dot));
  }
}

// dweight[c] += sum over rows of dy x rstd.
template <typename T, typename G>
static __global__ void RmsNormWeightGradKernel(G* dweight, const T* dout, const T* inp,
                                               const float* rstd, int64_t rows, int channels) {
  __shared__ float pw[launch::kRowPhases][launch::kColumnTile];
  const ColumnLane at;
  float w = 0.0f;
  if (at.col < channels) {
    for (int64_t r = at.phase; r < rows; r += launch::kRowPhases) {
      w += ToFloat(dout[r * channels + at.col]) * ToFloat(inp[r * channels + at.col]) * rstd[r];
    }
  }
  pw[at.phase][at.lane] = w;
  const float sw = SumPhases(pw, at);
  if (at.phase != 0 || at.col >= channels) return;
  dweight[at.col] = FromFloat<G>(ToFloat(dweight[at.col]) + sw);
}

__device__ __forceinline__ void RopeAngle(int64_t row, int seq, int i, int head_size,
                                          const Rope& rope, float* c, float* s) {
  const float inv_freq = RopeInvFreq<float>(rope, i, head_size);
  sincosf(static_cast<float>(row % seq) * inv_freq, s, c);
}

// One thread per (row, query head, channel pair): q's and k's pair rotated, v's two channels
// copied. n = rows x heads x hs / 2.
template <typename T>
static __global__ void RopeQkvKernel(T* qkv, const T* q, const T* k, const T* v, int seq, int heads,
                                     int kv_heads, int head_size, Rope rope, int64_t n) {
  const int half = head_size / 2, group = heads / kv_heads;
  const int64_t C = int64_t{heads} * head_size, KV = int64_t{kv_heads} * head_size;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int h = static_cast<int>((idx / half) % heads);
    const int64_t row = idx / (int64_t{half} * heads);
    float c, s;
    RopeAngle(row, seq, i, head_size, rope, &c, &s);
    T* out = qkv + row * 3 * C + int64_t{h} * head_size;
    const T* qs = q + row * C + int64_t{h} * head_size;
    const int64_t kvo = row * KV + int64_t{h / group} * head_size;
    const float q1 = ToFloat(qs[i]), q2 = ToFloat(qs[i + half]);
    const float k1 = ToFloat(k[kvo + i]), k2 = ToFloat(k[kvo + i + half]);
    out[i] = FromFloat<T>(q1 * c - q2 * s);
    out[i + half] = FromFloat<T>(q2 * c + q1 * s);
    out[C + i] = FromFloat<T>(k1 * c - k2 * s);
    out[C + i + half] = FromFloat<T>(k2 * c + k1 * s);
    out[2 * C + i] = v[kvo + i];
    out[2 * C + i + half] = v[kvo + i + half];
  }
}

// One thread per (row, key/value head, channel pair): the query heads of the group summed in
// order (no atomics), dq per query head. n = rows x kv_heads x hs / 2.
template <typename T>
static __global__ void RopeQkvBackwardKernel(T* dq, T* dk, T* dv, const T* dqkv, int seq, int heads,
                                             int kv_heads, int head_size, Rope rope, int64_t n) {
  const int half = head_size / 2, group = heads / kv_heads;
  const int64_t C = int64_t{heads} * head_size, KV = int64_t{kv_heads} * head_size;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int j = static_cast<int>((idx / half) % kv_heads);
    const int64_t row = idx / (int64_t{half} * kv_heads);
    float c, s;
    RopeAngle(row, seq, i, head_size, rope, &c, &s);
    const T* in = dqkv + row * 3 * C;
    float k1 = 0.0f, k2 = 0.0f, v1 = 0.0f, v2 = 0.0f;
    for (int h = j * group; h < (j + 1) * group; ++h) {
      const int64_t o = int64_t{h} * head_size;
      const float y1 = ToFloat(in[o + i]), y2 = ToFloat(in[o + i + half]);
      if (dq != nullptr) {
        T* d = dq + row * C + o;
        d[i] = FromFloat<T>(ToFloat(d[i]) + y1 * c + y2 * s);
        d[i + half] = FromFloat<T>(ToFloat(d[i + half]) + y2 * c - y1 * s);
      }
      const float z1 = ToFloat(in[C + o + i]), z2 = ToFloat(in[C + o + i + half]);
      k1 += z1 * c + z2 * s;
      k2 += z2 * c - z1 * s;
      v1 += ToFloat(in[2 * C + o + i]);
      v2 += ToFloat(in[2 * C + o + i + half]);
    }
    const int64_t kvo = row * KV + int64_t{j} * head_size;
    if (dk != nullptr) {
      dk[kvo + i] = FromFloat<T>(ToFloat(dk[kvo + i]) + k1);
      dk[kvo + i + half] = FromFloat<T>(ToFloat(dk[kvo + i + half]) + k2);
    }
    if (dv != nullptr) {
      dv[kvo + i] = FromFloat<T>(ToFloat(dv[kvo + i]) + v1);
      dv[kvo + i + half] = FromFloat<T>(ToFloat(dv[kvo + i + half]) + v2);
    }
  }
}

template <typename T>
static __global__ void SwiGluKernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = ToFloat(gate[i]);
    out[i] = FromFloat<T>(g / (1.0f + expf(-g)) * ToFloat(up[i]));
  }
}

template <typename T>
static __global__ void SwiGluBackwardKernel(T* dgate, T* dup, const T* dout, const T* gate,
                                            const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = ToFloat(gate[i]), dy = ToFloat(dout[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    if (dgate != nullptr) {
      dgate[i] =
          FromFloat<T>(ToFloat(dgate[i]) + dy * ToFloat(up[i]) * s * (1.0f + g * (1.0f - s)));
    }
    if (dup != nullptr) dup[i] = FromFloat<T>(ToFloat(dup[i]) + dy * g * s);
  }
}

}  // namespace
}  // namespace zerort
