// The CUDA twins of the LLaMA family's operations (kernels/cpu/llama_ops.cc; ModelKernels
// documents each): RMSNorm (a warp per row; the weight gradient by the column kernels'
// deterministic phases), rotary embeddings with grouped-query heads and SwiGLU (grid-stride
// element loops). Internal to kernels/cuda/, included by model_kernels.cu after model_ops.cuh.
// fp32 arithmetic; RMSNorm's, SwiGLU's and the rotary embeddings' element math is
// kernels/model_math.h's, the CPU's own (only the row sums' order differs), the rotary angles
// from kernels/rope.h's inv_freq ([Note: the rotary angles]).
#pragma once

#include "zerort/kernels/cuda/model_ops.cuh"
#include "zerort/kernels/rope.h"

namespace zerort {
namespace {

// W: the channels a lane takes at a time ([Note: the row kernels' width], model_ops.cuh).
template <typename T, int W>
static __global__ void RmsNormKernel(T* out, float* rstd, const T* inp, const T* residual,
                                     T* sum_out, const T* w, int64_t rows, int channels,
                                     float eps) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  if (residual != nullptr) x = AddResidualRow<W>(x, residual, sum_out, row, channels, lane);
  float v[W], u[W];
  float ss = 0.0f;
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(x + c, v);
#pragma unroll
    for (int e = 0; e < W; ++e) ss = math::Add(ss, math::RmsNormSquare(v[e]));
  }
  const float s = math::RmsNormRstd(WarpSum(ss), math::InverseCount(channels), eps);
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(x + c, v);
    LoadN(w + c, u);
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = math::RmsNormOut(v[e], s, u[e]);
    StoreN(out + row * channels + c, v);
  }
  if (lane == 0) rstd[row] = s;
}

// dinp += rstd (dn - n mean(dn n)), n = x rstd, dn = dy w, for `row` by its warp (W as
// RmsNormKernel's): the warp-per-row kernel's body, and the first pass of NormBackwardKernel's
// (norm_backward.cuh).
template <typename T, int W>
__device__ __forceinline__ void RmsNormInputGradRow(T* dinp, const T* dout, const T* inp,
                                                    const T* w, float s, int64_t row, int channels,
                                                    int lane) {
  const T* x = inp + row * channels;
  const T* dy = dout + row * channels;
  float xv[W], dv[W], wv[W], gv[W];
  float dot = 0.0f;
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(dy + c, dv);
    LoadN(w + c, wv);
    LoadN(x + c, xv);
#pragma unroll
    for (int e = 0; e < W; ++e) dot = math::Add(dot, math::RmsNormDot(dv[e], wv[e], xv[e], s));
  }
  dot = math::Mul(WarpSum(dot), math::InverseCount(channels));
  for (int c = lane * W; c < channels; c += 32 * W) {
    T* d = dinp + row * channels + c;
    LoadN(dy + c, dv);
    LoadN(w + c, wv);
    LoadN(x + c, xv);
    LoadN(d, gv);
#pragma unroll
    for (int e = 0; e < W; ++e) gv[e] = math::RmsNormInputGrad(gv[e], dv[e], wv[e], xv[e], s, dot);
    StoreN(d, gv);
  }
}
template <typename T, int W>
static __global__ void RmsNormInputGradKernel(T* dinp, const T* dout, const T* inp, const T* w,
                                              const float* rstd, int64_t rows, int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (row >= rows) return;
  RmsNormInputGradRow<T, W>(dinp, dout, inp, w, rstd[row], row, channels, threadIdx.x & 31);
}

// [Note: the rotary frequencies' argument]
// A rotary kernel takes its pairs' frequencies by value (rope.h's RopeFrequency, computed on the
// host: [Note: the rotary angles], model_math.h), so no device's powf enters the angle, and each
// block first copies them to shared memory: a warp's threads read different pairs', and reads of
// different words of a kernel's argument (constant memory) are serialised. Head sizes up to
// kMaxCudaRopeHeadSize (rope.h: 1 KB of argument).
inline constexpr int kMaxRopePairs = kMaxCudaRopeHeadSize / 2;
struct RopeFrequencies {
  float inv_freq[kMaxRopePairs];
  float scale;  // each cosine's and sine's (rope.h's RopeCosSinScale: YaRN's attention factor)
};

__device__ __forceinline__ void LoadFrequencies(float* shared, const RopeFrequencies& f, int half) {
  for (int j = threadIdx.x; j < half; j += blockDim.x) shared[j] = f.inv_freq[j];
  __syncthreads();
}

// A rotary thread's work, from its index over rows x hs / 2 channel pairs: pair i of `row`,
// turned by the angle whose cosine and sine are c and s, in every head slot of the row (0..heads-1
// the query heads, then the key heads). The angle is the same in all of them, so its cosine and
// sine (and the index's int64 division) are paid once a row and pair, not once a head slot
// (LLaMA-1B: 40 slots a row).
struct RotaryWork {
  int i;
  int64_t row;
  float c, s;
};
__device__ __forceinline__ RotaryWork RotaryWorkOf(int64_t idx, int seq, int half,
                                                   const float* inv_freq, float scale) {
  RotaryWork a;
  a.row = idx / half;
  a.i = static_cast<int>(idx - a.row * half);
  const math::CosSin cs = math::RopeScaled(
      math::RopeCosSin(math::RopeAngle(static_cast<int>(a.row % seq), inv_freq[a.i])), scale);
  a.c = cs.cos;
  a.s = cs.sin;
  return a;
}

// One thread per (row, channel pair), over the query and then the kv_heads key/value head slots
// ([Note: the qkv layout]): q's or k's pair rotated, with k's the value head's two channels
// copied. n = rows x hs / 2.
template <typename T>
static __global__ void RopeQkvKernel(T* qkv, const T* q, const T* k, const T* v, int seq, int heads,
                                     int kv_heads, int head_size, RopeFrequencies f, int64_t n) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int half = head_size / 2;
  __shared__ float inv_freq[kMaxRopePairs];
  LoadFrequencies(inv_freq, f, half);
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const auto [i, row, c, s] = RotaryWorkOf(idx, seq, half, inv_freq, f.scale);
    for (int slot = 0; slot < heads + kv_heads; ++slot) {
      T* out = qkv + row * l.row() + int64_t{slot} * head_size;  // q head, or k head slot - heads
      const T* x = slot < heads ? q + row * l.q_cols() + int64_t{slot} * head_size
                                : k + row * l.kv_cols() + int64_t{slot - heads} * head_size;
      const float x1 = ToFloat(x[i]), x2 = ToFloat(x[i + half]);
      out[i] = FromFloat<T>(math::RopeTurnFirst(x1, x2, c, s));
      out[i + half] = FromFloat<T>(math::RopeTurnSecond(x1, x2, c, s));
      if (slot >= heads) {
        const T* vs = v + row * l.kv_cols() + int64_t{slot - heads} * head_size;
        out[l.kv_cols() + i] = vs[i];
        out[l.kv_cols() + i + half] = vs[i + half];
      }
    }
  }
}

// The transpose (the turn by -angle), added into dq, dk, dv (a null one skipped), over the same
// threads as the forward: dqkv's key/value heads are already summed over their query heads (the
// attention's backward did it).
template <typename T>
static __global__ void RopeQkvBackwardKernel(T* dq, T* dk, T* dv, const T* dqkv, int seq, int heads,
                                             int kv_heads, int head_size, RopeFrequencies f,
                                             int64_t n) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int half = head_size / 2;
  __shared__ float inv_freq[kMaxRopePairs];
  LoadFrequencies(inv_freq, f, half);
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const auto [i, row, c, s] = RotaryWorkOf(idx, seq, half, inv_freq, f.scale);
    for (int slot = 0; slot < heads + kv_heads; ++slot) {
      const T* in = dqkv + row * l.row() + int64_t{slot} * head_size;
      T* d = slot < heads
                 ? (dq == nullptr ? nullptr : dq + row * l.q_cols() + int64_t{slot} * head_size)
                 : (dk == nullptr ? nullptr
                                  : dk + row * l.kv_cols() + int64_t{slot - heads} * head_size);
      const float y1 = ToFloat(in[i]), y2 = ToFloat(in[i + half]);
      if (d != nullptr) {
        d[i] = FromFloat<T>(math::Add(ToFloat(d[i]), math::RopeTurnFirst(y1, y2, c, -s)));
        d[i + half] =
            FromFloat<T>(math::Add(ToFloat(d[i + half]), math::RopeTurnSecond(y1, y2, c, -s)));
      }
      if (slot >= heads && dv != nullptr) {
        T* dvs = dv + row * l.kv_cols() + int64_t{slot - heads} * head_size;
        dvs[i] = FromFloat<T>(math::Add(ToFloat(dvs[i]), ToFloat(in[l.kv_cols() + i])));
        dvs[i + half] =
            FromFloat<T>(math::Add(ToFloat(dvs[i + half]), ToFloat(in[l.kv_cols() + i + half])));
      }
    }
  }
}

// In place on qkv ([Note: the qkv layout]), over the query and key head slots' channel pairs:
// the rotation, or with `transpose` its transpose (turned by -angle). n = rows x hs / 2; each
// thread reads and writes its own pair in each slot.
template <typename T>
static __global__ void RopeQkvInPlaceKernel(T* qkv, int seq, int heads, int kv_heads, int head_size,
                                            RopeFrequencies f, bool transpose, int64_t n) {
  const math::QkvLayout l{heads, kv_heads, head_size};
  const int half = head_size / 2;
  __shared__ float inv_freq[kMaxRopePairs];
  LoadFrequencies(inv_freq, f, half);
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const RotaryWork a = RotaryWorkOf(idx, seq, half, inv_freq, f.scale);
    const int i = a.i;
    const float c = a.c, s = transpose ? -a.s : a.s;  // the transpose turns by -angle
    for (int slot = 0; slot < heads + kv_heads; ++slot) {
      T* x = qkv + a.row * l.row() + int64_t{slot} * head_size;  // a q head, or a k head
      const float x1 = ToFloat(x[i]), x2 = ToFloat(x[i + half]);
      x[i] = FromFloat<T>(math::RopeTurnFirst(x1, x2, c, s));
      x[i + half] = FromFloat<T>(math::RopeTurnSecond(x1, x2, c, s));
    }
  }
}

// Where output element i's gate is in gate_up (its up is up() further): ModelKernels::SwiGlu's
// planar or interleaved layout.
struct GatedIndex {
  int64_t rows;
  int cols;
  bool interleaved;
  __device__ int64_t gate(int64_t i) const { return interleaved ? i + (i / cols) * cols : i; }
  __device__ int64_t up() const { return interleaved ? cols : rows * cols; }
};

template <typename T>
static __global__ void SwiGluKernel(T* out, const T* gate_up, GatedIndex at, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = at.gate(i);
    const float g = ToFloat(gate_up[j]);
    out[i] = FromFloat<T>(math::SwiGlu(g, ToFloat(gate_up[j + at.up()])));
  }
}

// SwiGluKernel kVec outputs at a time (cols a multiple of kVec: a vector never crosses a row, and
// its gates and ups are kVec contiguous elements each).
template <typename T>
static __global__ void SwiGluVecKernel(T* out, const T* gate_up, GatedIndex at, int64_t vectors) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < vectors;
       v += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = at.gate(v * kVec);
    float g[kVec], u[kVec];
    LoadVec(gate_up + j, g);
    LoadVec(gate_up + j + at.up(), u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[e] = math::SwiGlu(g[e], u[e]);
    StoreVec(out + v * kVec, g);
  }
}

template <typename T>
static __global__ void SwiGluBackwardKernel(T* dgate_up, const T* dout, const T* gate_up,
                                            GatedIndex at, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = at.gate(i), u = j + at.up();
    const float g = ToFloat(gate_up[j]), dy = ToFloat(dout[i]);
    const float s = math::Sigmoid(g);
    dgate_up[j] = FromFloat<T>(math::SwiGluGateGrad(dy, g, ToFloat(gate_up[u]), s));
    dgate_up[u] = FromFloat<T>(math::SwiGluUpGrad(dy, g, s));
  }
}

// SwiGluBackwardKernel kVec outputs at a time (as SwiGluVecKernel).
template <typename T>
static __global__ void SwiGluBackwardVecKernel(T* dgate_up, const T* dout, const T* gate_up,
                                               GatedIndex at, int64_t vectors) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < vectors;
       v += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = at.gate(v * kVec), u = j + at.up();
    float g[kVec], up[kVec], dy[kVec], dg[kVec], du[kVec];
    LoadVec(gate_up + j, g);
    LoadVec(gate_up + u, up);
    LoadVec(dout + v * kVec, dy);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float s = math::Sigmoid(g[e]);
      dg[e] = math::SwiGluGateGrad(dy[e], g[e], up[e], s);
      du[e] = math::SwiGluUpGrad(dy[e], g[e], s);
    }
    StoreVec(dgate_up + j, dg);
    StoreVec(dgate_up + u, du);
  }
}

}  // namespace
}  // namespace zerort
