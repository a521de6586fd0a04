// The CUDA model kernels' device code (internal to kernels/cuda/, included by model_kernels.cu
// only): static __global__ kernels for the element-wise ops, LayerNorm, the causal softmax and the
// fused softmax cross-entropy, with their launchers on raw pointers and a stream.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/convert.cuh"
#include "kernels/memory_facts.h"
#include "runtime/dtype.h"
#include "runtime/internal/cuda_check.h"

namespace zerort {
namespace {

using cuda::FromFloat;
using cuda::ToFloat;
using bf16 = __nv_bfloat16;
using f16 = __half;

template <typename T>
constexpr DType DTypeOfCuda() {
  if constexpr (std::is_same_v<T, bf16>) return DType::kBF16;
  if constexpr (std::is_same_v<T, f16>) return DType::kF16;
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float>);
  return DType::kF32;
}

constexpr int kThreads = 256;
constexpr float kLnEps = 1e-5f;
constexpr size_t kLtWorkspace = kCudaLtWorkspaceBytes;  // kernels/memory_facts.h

// Grid of a grid-stride loop over n elements; at least one block, so n = 0 is a launch that does
// nothing rather than an invalid configuration (a grid of 0).
int Blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535 * 8));
}
// Grid of a warp-per-row kernel (no grid-stride loop: every row gets its warp; rows past the end
// return at once, so 0 rows is one idle block).
unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>((rows * 32 + kThreads - 1) / kThreads, 1));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct SumOp {
  static constexpr float kIdentity = 0.0f;
  __device__ static float Warp(float v) { return WarpSum(v); }
};
struct MaxOp {
  static constexpr float kIdentity = -INFINITY;
  __device__ static float Warp(float v) { return WarpMax(v); }
};

// Reduction over a block of kThreads threads; every thread gets the result.
template <typename Op>
__device__ float BlockReduce(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  v = Op::Warp(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : Op::kIdentity;
    w = Op::Warp(w);
    if (threadIdx.x == 0) total = w;
  }
  __syncthreads();
  const float out = total;
  __syncthreads();
  return out;
}
__device__ float BlockSum(float v) { return BlockReduce<SumOp>(v); }
__device__ float BlockMax(float v) { return BlockReduce<MaxOp>(v); }

__device__ __forceinline__ void AtomicAddTo(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void AtomicAddTo(bf16* p, float v) { atomicAdd(p, __float2bfloat16(v)); }
__device__ __forceinline__ void AtomicAddTo(f16* p, float v) { atomicAdd(p, __float2half(v)); }

// ---- element-wise ----------------------------------------------------------------------------

template <typename T>
static __global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename D, typename S>
static __global__ void AccumulateKernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = FromFloat<D>(ToFloat(dst[i]) + ToFloat(src[i]));
  }
}

template <typename T>
static __global__ void AddBiasKernel(T* out, const T* bias, int64_t rows, int cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(ToFloat(out[i]) + ToFloat(bias[i % cols]));
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

template <typename T>
static __global__ void GeluKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(inp[i]);
    out[i] = FromFloat<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
  }
}

template <typename T>
static __global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(inp[i]);
    const float t = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float local = 0.5f * (1.0f + t) +
                        0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = FromFloat<T>(ToFloat(dinp[i]) + local * ToFloat(dout[i]));
  }
}

// ---- embedding -------------------------------------------------------------------------------

template <typename T>
static __global__ void EmbeddingKernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int seq, int channels, int begin, int count, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / channels;
    const int c = static_cast<int>(i % channels);
    const int t = static_cast<int>(row % seq);
    const int64_t v = tokens[row] - int64_t{begin};
    const float te = v >= 0 && v < count ? ToFloat(wte[v * channels + c]) : 0.0f;
    const float pe = wpe != nullptr ? ToFloat(wpe[int64_t{t} * channels + c]) : 0.0f;
    out[i] = FromFloat<T>(te + pe);
  }
}

template <typename T, typename G>
static __global__ void EmbeddingBackwardKernel(G* dwte, G* dwpe, const T* dout,
                                               const int32_t* tokens, int seq, int channels,
                                               int begin, int count, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / channels;
    const int c = static_cast<int>(i % channels);
    const int t = static_cast<int>(row % seq);
    const float d = ToFloat(dout[i]);
    const int64_t v = tokens[row] - int64_t{begin};
    if (dwte != nullptr && v >= 0 && v < count) AtomicAddTo(dwte + v * channels + c, d);
    if (dwpe != nullptr) AtomicAddTo(dwpe + int64_t{t} * channels + c, d);
  }
}

// ---- LayerNorm: one warp per row -------------------------------------------------------------

template <typename T>
static __global__ void LayerNormKernel(T* out, float* mean, float* rstd, const T* inp, const T* w,
                                       const T* b, int64_t rows, int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  float sum = 0.0f;
  for (int c = lane; c < channels; c += 32) sum += ToFloat(x[c]);
  const float m = WarpSum(sum) / channels;
  float var = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float d = ToFloat(x[c]) - m;
    var += d * d;
  }
  const float s = rsqrtf(WarpSum(var) / channels + kLnEps);
  for (int c = lane; c < channels; c += 32) {
    out[row * channels + c] = FromFloat<T>((ToFloat(x[c]) - m) * s * ToFloat(w[c]) + ToFloat(b[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp += per row; dweight/dbias partial sums go to fp32 scratch [2 * channels] by atomics and are
// added into the gradient buffers (any dtype) afterwards.
template <typename T>
static __global__ void LayerNormBackwardKernel(T* dinp, float* dwb, const T* dout, const T* inp,
                                               const T* w, const float* mean, const float* rstd,
                                               int64_t rows, int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  const T* dy = dout + row * channels;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < channels; c += 32) {
    const float norm = (ToFloat(x[c]) - m) * s;
    const float dnorm = ToFloat(dy[c]) * ToFloat(w[c]);
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = WarpSum(dnorm_mean) / channels;
  dnorm_norm_mean = WarpSum(dnorm_norm_mean) / channels;
  for (int c = lane; c < channels; c += 32) {
    const float norm = (ToFloat(x[c]) - m) * s;
    const float g = ToFloat(dy[c]);
    atomicAdd(dwb + c, norm * g);
    atomicAdd(dwb + channels + c, g);
    if (dinp != nullptr) {
      const float dnorm = g * ToFloat(w[c]);
      T* d = dinp + row * channels + c;
      *d = FromFloat<T>(ToFloat(*d) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
}

// dbias[o] += sum over rows of dout[r, o]: one block per column, fixed order (deterministic).
template <typename T, typename G>
static __global__ void BiasGradKernel(G* dbias, const T* dout, int64_t rows, int cols) {
  const int o = blockIdx.x;
  float acc = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += ToFloat(dout[r * cols + o]);
  acc = BlockSum(acc);
  if (threadIdx.x == 0) dbias[o] = FromFloat<G>(ToFloat(dbias[o]) + acc);
}

// ---- attention pieces ------------------------------------------------------------------------

// Element i of a head-major tensor [B, NH, T, HS]: where the same element sits in a token-major
// one with `parts` tensors side by side per token ([B, T, parts, NH, HS]; parts 3 for qkv).
__device__ __forceinline__ int64_t TokenMajorIndex(int64_t i, int seq, int heads, int hs,
                                                   int parts) {
  const int d = static_cast<int>(i % hs);
  const int t = static_cast<int>((i / hs) % seq);
  const int h = static_cast<int>((i / (int64_t{hs} * seq)) % heads);
  const int64_t b = i / (int64_t{hs} * seq * heads);
  return ((b * seq + t) * parts * heads + h) * hs + d;
}

// qkv [B, T, 3, NH, HS] -> q, k, v [B, NH, T, HS]
template <typename T>
static __global__ void SplitHeadsKernel(T* q, T* k, T* v, const T* qkv, int batch, int seq,
                                        int heads, int hs) {
  const int64_t n = int64_t{batch} * heads * seq * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t src = TokenMajorIndex(i, seq, heads, hs, 3);
    const int64_t c = int64_t{heads} * hs;
    q[i] = qkv[src];
    k[i] = qkv[src + c];
    v[i] = qkv[src + 2 * c];
  }
}

// dqkv [B, T, 3, NH, HS] += dq, dk, dv [B, NH, T, HS]
template <typename T>
static __global__ void MergeHeadGradsKernel(T* dqkv, const T* dq, const T* dk, const T* dv,
                                            int batch, int seq, int heads, int hs) {
  const int64_t n = int64_t{batch} * heads * seq * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t dst = TokenMajorIndex(i, seq, heads, hs, 3);
    const int64_t c = int64_t{heads} * hs;
    dqkv[dst] = FromFloat<T>(ToFloat(dqkv[dst]) + ToFloat(dq[i]));
    dqkv[dst + c] = FromFloat<T>(ToFloat(dqkv[dst + c]) + ToFloat(dk[i]));
    dqkv[dst + 2 * c] = FromFloat<T>(ToFloat(dqkv[dst + 2 * c]) + ToFloat(dv[i]));
  }
}

// y [B, NH, T, HS] -> out [B, T, NH, HS]   (forward == true), or its inverse.
template <typename T>
static __global__ void HeadsLayoutKernel(T* dst, const T* src, int batch, int seq, int heads,
                                         int hs, bool to_tokens) {
  const int64_t n = int64_t{batch} * heads * seq * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tok = TokenMajorIndex(i, seq, heads, hs, 1);
    if (to_tokens) {
      dst[tok] = src[i];
    } else {
      dst[i] = src[tok];
    }
  }
}

// att[row, :] = causal softmax(scale * preatt[row, :]); row = (b, h, t); one warp per row.
template <typename T>
static __global__ void CausalSoftmaxKernel(T* att, const T* preatt, int64_t rows, int seq,
                                           float scale) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = static_cast<int>(row % seq);
  const T* x = preatt + row * seq;
  T* y = att + row * seq;
  float max = -INFINITY;
  for (int j = lane; j <= t; j += 32) max = fmaxf(max, scale * ToFloat(x[j]));
  max = WarpMax(max);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += 32) sum += expf(scale * ToFloat(x[j]) - max);
  sum = WarpSum(sum);
  for (int j = lane; j < seq; j += 32) {
    y[j] = FromFloat<T>(j <= t ? expf(scale * ToFloat(x[j]) - max) / sum : 0.0f);
  }
}

// dscore = att * (datt - sum(att * datt)) for the causal part, 0 above the diagonal; in place.
template <typename T>
static __global__ void CausalSoftmaxBackwardKernel(T* datt, const T* att, int64_t rows, int seq) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = static_cast<int>(row % seq);
  T* d = datt + row * seq;
  const T* a = att + row * seq;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += ToFloat(a[j]) * ToFloat(d[j]);
  dot = WarpSum(dot);
  for (int j = lane; j < seq; j += 32) {
    d[j] = FromFloat<T>(j <= t ? ToFloat(a[j]) * (ToFloat(d[j]) - dot) : 0.0f);
  }
}

// ---- softmax cross-entropy: one block per row ------------------------------------------------

template <typename T>
static __global__ void CrossEntropyKernel(T* logits, float* losses, const int32_t* targets,
                                          int vocab, float scale) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  float max = -INFINITY;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) max = fmaxf(max, ToFloat(z[v]));
  max = BlockMax(max);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) sum += expf(ToFloat(z[v]) - max);
  sum = BlockSum(sum);
  const float log_sum = logf(sum);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = -(ToFloat(z[target]) - max - log_sum);
  __syncthreads();  // z[target] is read above before anyone overwrites it
  if (scale == 0.0f) return;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float p = expf(ToFloat(z[v]) - max - log_sum);
    z[v] = FromFloat<T>((p - (v == target ? 1.0f : 0.0f)) * scale);
  }
}

// Vocabulary-parallel cross-entropy (ModelKernels::VocabMax / VocabSums / ...Finish): one block
// per row, over this rank's `valid` columns of a row of `vocab`.
template <typename T>
static __global__ void VocabMaxKernel(const T* logits, float* max, int vocab, int valid) {
  const T* z = logits + blockIdx.x * int64_t{vocab};
  float m = -INFINITY;
  for (int v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, ToFloat(z[v]));
  m = BlockMax(m);
  if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename T>
static __global__ void VocabSumsKernel(const T* logits, const float* gmax, const int32_t* targets,
                                       float* sums, int64_t rows, int vocab, int valid, int begin) {
  const int64_t row = blockIdx.x;
  const T* z = logits + row * vocab;
  float sum = 0.0f;
  for (int v = threadIdx.x; v < valid; v += blockDim.x) sum += expf(ToFloat(z[v]) - gmax[row]);
  sum = BlockSum(sum);
  if (threadIdx.x == 0) {
    const int t = targets[row] - begin;
    sums[row] = sum;
    sums[rows + row] = t >= 0 && t < valid ? ToFloat(z[t]) : 0.0f;
  }
}

template <typename T>
static __global__ void VocabFinishKernel(T* logits, float* losses, const float* gmax,
                                         const float* gsums, const int32_t* targets, int64_t rows,
                                         int vocab, int valid, int begin, float scale) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  const float m = gmax[row], sum = gsums[row];
  if (threadIdx.x == 0) losses[row] = logf(sum) + m - gsums[rows + row];
  if (scale == 0.0f) return;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    if (v >= valid) {
      z[v] = FromFloat<T>(0.0f);
      continue;
    }
    const float p = expf(ToFloat(z[v]) - m) / sum;
    z[v] = FromFloat<T>((p - (v + begin == targets[row] ? 1.0f : 0.0f)) * scale);
  }
}

}  // namespace
}  // namespace zerort
