// The CUDA model kernels' device code (internal to kernels/cuda/, included by model_kernels.cu
// only): static __global__ kernels for the element-wise ops, LayerNorm, the causal softmax and the
// fused softmax cross-entropy. Their element arithmetic is kernels/model_math.h's, the CPU
// kernels' own; what is CUDA-only here is the thread indexing, the warp and block reductions and
// the column kernels' tiling (kernels/README.md lists it with the GPU test of each).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/cuda/exp2.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_math.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

using cuda::Ex2Approx;
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

// The cuBLAS element type of T.
template <typename T>
constexpr cudaDataType_t CudaType() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, f16>) {
    return CUDA_R_16F;
  } else {
    return CUDA_R_16BF;
  }
}

constexpr int kThreads = launch::kThreads;
constexpr float kLnEps = 1e-5f;
constexpr size_t kLtWorkspace = kCudaLtWorkspaceBytes;  // kernels/memory_facts.h
constexpr size_t kLtBiasGradBytes = size_t{64} << 10;   // BGRADB's sums, the workspace's end

// Grids (kernels/launch_geometry.h): a grid-stride loop over n elements; a warp per row (the
// column sums' grid: launch::ColumnSumsFor).
int Blocks(int64_t n) { return launch::GridStrideBlocks(n, 65535 * 8); }
unsigned RowBlocks(int64_t rows) { return static_cast<unsigned>(launch::WarpPerRowBlocks(rows)); }

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

// Reduction over a block of kBlock threads (at most 1024); every thread gets the result.
template <typename Op, int kBlock = kThreads>
__device__ float BlockReduce(float v) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024, "BlockReduce: whole warps, at most 32 of them");
  __shared__ float partial[kBlock / 32];
  __shared__ float total;
  v = Op::Warp(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < kBlock / 32 ? partial[threadIdx.x] : Op::kIdentity;
    w = Op::Warp(w);
    if (threadIdx.x == 0) total = w;
  }
  __syncthreads();
  const float out = total;
  __syncthreads();
  return out;
}
template <int kBlock = kThreads>
__device__ float BlockSum(float v) {
  return BlockReduce<SumOp, kBlock>(v);
}
template <int kBlock = kThreads>
__device__ float BlockMax(float v) {
  return BlockReduce<MaxOp, kBlock>(v);
}

// ---- 128-bit vectors -------------------------------------------------------------------------
// kVec elements moved by 16-byte loads and stores (one for a 16-bit type, two for fp32) and
// converted by the same ToFloat/FromFloat as the scalar kernels, so a vectorised kernel computes
// its scalar twin's bits. It needs every pointer 16-byte aligned and whole vectors
// (Vectorisable); otherwise the launcher runs the scalar kernel.
constexpr int kVec = 8;
template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&v)[kVec]) {
  constexpr int kPer = 16 / sizeof(T);
#pragma unroll
  for (int q = 0; q < kVec / kPer; ++q) {
    const uint4 raw = reinterpret_cast<const uint4*>(p)[q];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[q * kPer + i] = ToFloat(e[i]);
  }
}
template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kVec]) {
  constexpr int kPer = 16 / sizeof(T);
#pragma unroll
  for (int q = 0; q < kVec / kPer; ++q) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPer; ++i) e[i] = FromFloat<T>(v[q * kPer + i]);
    reinterpret_cast<uint4*>(p)[q] = raw;
  }
}
// W elements (1, or kVec by LoadVec/StoreVec): the row kernels' loads and stores at either width.
template <int W, typename T>
__device__ __forceinline__ void LoadN(const T* p, float (&v)[W]) {
  if constexpr (W == kVec) {
    LoadVec(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = ToFloat(p[i]);
  }
}
template <int W, typename T>
__device__ __forceinline__ void StoreN(T* p, const float (&v)[W]) {
  if constexpr (W == kVec) {
    StoreVec(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = FromFloat<T>(v[i]);
  }
}

// Host: whether n elements at these pointers can go kVec at a time.
bool Vectorisable(int64_t n, std::initializer_list<const void*> pointers) {
  if (n % kVec != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// ---- element-wise ----------------------------------------------------------------------------

template <typename T>
static __global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

// out = a + b, kVec at a time (Add; Accumulate with out = a).
template <typename O, typename A, typename B>
static __global__ void AddVecKernel(O* out, const A* a, const B* b, int64_t vectors) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < vectors;
       v += int64_t{gridDim.x} * blockDim.x) {
    float x[kVec], y[kVec];
    LoadVec(a + v * kVec, x);
    LoadVec(b + v * kVec, y);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = x[i] + y[i];
    StoreVec(out + v * kVec, x);
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

template <typename T>
static __global__ void GeluKernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = FromFloat<T>(math::Gelu(ToFloat(inp[i])));
  }
}

template <typename T>
static __global__ void GeluBackwardKernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dinp[i] = FromFloat<T>(math::GeluBackward(ToFloat(dinp[i]), ToFloat(inp[i]), ToFloat(dout[i])));
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
    const int64_t v = math::EmbeddingRow(tokens[row], begin, count);
    const float te = v >= 0 ? ToFloat(wte[v * channels + c]) : 0.0f;
    const float pe = wpe != nullptr ? ToFloat(wpe[int64_t{t} * channels + c]) : 0.0f;
    out[i] = FromFloat<T>(te + pe);
  }
}

// dwte, dwpe (fp32: 16-bit gradients are summed in fp32 scratch first) += dout, by float atomics.
template <typename T>
static __global__ void EmbeddingBackwardKernel(float* dwte, float* dwpe, const T* dout,
                                               const int32_t* tokens, int seq, int channels,
                                               int begin, int count, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / channels;
    const int c = static_cast<int>(i % channels);
    const int t = static_cast<int>(row % seq);
    const float d = ToFloat(dout[i]);
    const int64_t v = math::EmbeddingRow(tokens[row], begin, count);
    if (dwte != nullptr && v >= 0) atomicAdd(dwte + v * channels + c, d);
    if (dwpe != nullptr) atomicAdd(dwpe + int64_t{t} * channels + c, d);
  }
}

// ---- LayerNorm: one warp per row -------------------------------------------------------------

// The fused residual of AddLayerNorm and AddRmsNorm: row `row` of x + residual written to
// sum_out, rounded to T as the Add kernel rounds it, W channels a lane; the row to normalise.
template <int W, typename T>
__device__ const T* AddResidualRow(const T* x, const T* residual, T* sum_out, int64_t row,
                                   int channels, int lane) {
  T* s = sum_out + row * channels;
  const T* r = residual + row * channels;
  float v[W], u[W];
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(x + c, v);
    LoadN(r + c, u);
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = v[e] + u[e];
    StoreN(s + c, v);
  }
  return s;
}

// With a `residual` (AddLayerNorm: the residual connection fused in), the row of inp + residual is
// written to `sum` first, rounded to T as the Add kernel rounds it, and normalised from there:
// each lane reads back only the channels it wrote, so no synchronisation is needed, and `sum` may
// be `inp` or `residual`. W: the channels a lane takes at a time (kVec where the row is whole
// 128-bit vectors, [Note: the row kernels' width]).
// [Note: the row kernels' width] The warp-per-row kernels (LayerNorm, RMSNorm and their input
// gradients) run at W = kVec where channels is a multiple of kVec and every pointer is 16-byte
// aligned (RowWidth), lane l taking channels 8 l .. 8 l + 7, then 256 further on; else W = 1,
// lane l taking channels l, l + 32, .... Each element's arithmetic is the same at both widths;
// the order of a row's sums (each lane's, then the warp's) differs, which is what the devices do
// not share anyway (kernels/README.md).
template <typename T, int W>
static __global__ void LayerNormKernel(T* out, float* mean, float* rstd, const T* inp,
                                       const T* residual, T* sum_out, const T* w, const T* b,
                                       int64_t rows, int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* x = inp + row * channels;
  if (residual != nullptr) x = AddResidualRow<W>(x, residual, sum_out, row, channels, lane);
  float v[W], u[W];
  const float inv_c = math::InverseCount(channels);
  float sum = 0.0f;
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(x + c, v);
#pragma unroll
    for (int e = 0; e < W; ++e) sum += v[e];
  }
  const float m = math::Mul(WarpSum(sum), inv_c);
  float var = 0.0f;
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(x + c, v);
#pragma unroll
    for (int e = 0; e < W; ++e) var = math::Add(var, math::SquaredDeviation(v[e], m));
  }
  const float s = math::LayerNormRstd(WarpSum(var), inv_c, kLnEps);
  for (int c = lane * W; c < channels; c += 32 * W) {
    float wv[W], bv[W];
    LoadN(x + c, v);
    LoadN(w + c, wv);
    LoadN(b + c, bv);
#pragma unroll
    for (int e = 0; e < W; ++e) u[e] = math::LayerNormOut(v[e], m, s, wv[e], bv[e]);
    StoreN(out + row * channels + c, u);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp += LayerNorm's input gradient of `row`, by its warp (W as LayerNormKernel's): the
// warp-per-row kernel's body, and the first pass of NormBackwardKernel's (norm_backward.cuh).
template <typename T, int W>
__device__ __forceinline__ void LayerNormInputGradRow(T* dinp, const T* dout, const T* inp,
                                                      const T* w, float m, float s, int64_t row,
                                                      int channels, int lane) {
  const T* x = inp + row * channels;
  const T* dy = dout + row * channels;
  const float inv_c = math::InverseCount(channels);
  float xv[W], dv[W], wv[W], gv[W];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane * W; c < channels; c += 32 * W) {
    LoadN(dy + c, dv);
    LoadN(w + c, wv);
    LoadN(x + c, xv);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const float dnorm = math::LayerNormDnorm(dv[e], wv[e]);
      dnorm_mean = math::Add(dnorm_mean, dnorm);
      dnorm_norm_mean = math::Add(dnorm_norm_mean, math::LayerNormDnormNorm(dnorm, xv[e], m, s));
    }
  }
  dnorm_mean = math::Mul(WarpSum(dnorm_mean), inv_c);
  dnorm_norm_mean = math::Mul(WarpSum(dnorm_norm_mean), inv_c);
  for (int c = lane * W; c < channels; c += 32 * W) {
    T* d = dinp + row * channels + c;
    LoadN(dy + c, dv);
    LoadN(w + c, wv);
    LoadN(x + c, xv);
    LoadN(d, gv);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      gv[e] = math::Add(
          gv[e], math::LayerNormInputGrad(dv[e], wv[e], xv[e], m, s, dnorm_mean, dnorm_norm_mean));
    }
    StoreN(d, gv);
  }
}
// A warp per row; the weight and bias gradients are the column sums' (SumColumns), or this and
// they are one pass (NormBackwardKernel) when both are asked for.
template <typename T, int W>
static __global__ void LayerNormInputGradKernel(T* dinp, const T* dout, const T* inp, const T* w,
                                                const float* mean, const float* rstd, int64_t rows,
                                                int channels) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (row >= rows) return;
  LayerNormInputGradRow<T, W>(dinp, dout, inp, w, mean[row], rstd[row], row, channels,
                              threadIdx.x & 31);
}

// Column sums over rows ([Note: column sums], kernels/launch_geometry.h): kBias sums dy into pw
// (a bias gradient; inp, mean, rstd and pb unused); kLayerNorm (x - mean) rstd dy into pw and dy
// into pb; kRms x rstd dy into pw (mean and pb unused). The partials of (tile, chunk), by the
// block's threads: W adjacent columns a lane (W = kVec: one 16-byte load of each row's dout and
// inp; 1 otherwise), rows warp, warp + kWarpsPerBlock, ... of the chunk, then the warps' sums
// added in order; partial [chunk, column] written. It ends with a barrier, so a block may take
// another tile next (NormBackwardKernel does).
enum class ColumnSum { kBias, kLayerNorm, kRms };
template <ColumnSum kKind, typename T, int W>
__device__ __forceinline__ void ColumnPartialsTile(float* pw, float* pb, const T* dout,
                                                   const T* inp, const float* mean,
                                                   const float* rstd, int64_t rows, int channels,
                                                   int64_t rows_per_chunk, int64_t tile,
                                                   int64_t chunk) {
  constexpr int kTile = 32 * W;
  constexpr bool kTwo = kKind == ColumnSum::kLayerNorm;  // pb too: LayerNorm's bias
  __shared__ float sw[launch::kWarpsPerBlock][kTile];
  __shared__ float sb[kTwo ? launch::kWarpsPerBlock : 1][kTwo ? kTile : 1];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t col = tile * kTile + lane * W;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float w[W], b[W];
#pragma unroll
  for (int e = 0; e < W; ++e) w[e] = b[e] = 0.0f;
  if (col < channels) {
#pragma unroll 4
    for (int64_t r = r0 + warp; r < r1; r += launch::kWarpsPerBlock) {
      float dy[W];
      LoadN(dout + r * channels + col, dy);
      if constexpr (kKind == ColumnSum::kBias) {
#pragma unroll
        for (int e = 0; e < W; ++e) w[e] = math::Add(w[e], dy[e]);
      } else {
        float x[W];
        LoadN(inp + r * channels + col, x);
        const float s = rstd[r];
        if constexpr (kTwo) {
          const float m = mean[r];
#pragma unroll
          for (int e = 0; e < W; ++e) {
            w[e] = math::Add(w[e], math::LayerNormWeightGrad(x[e], m, s, dy[e]));
            b[e] = math::Add(b[e], dy[e]);
          }
        } else {
#pragma unroll
          for (int e = 0; e < W; ++e)
            w[e] = math::Add(w[e], math::RmsNormWeightGrad(dy[e], x[e], s));
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < W; ++e) {
    sw[warp][lane * W + e] = w[e];
    if constexpr (kTwo) sb[warp][lane * W + e] = b[e];
  }
  __syncthreads();
  for (int t = static_cast<int>(threadIdx.x); t < kTile; t += static_cast<int>(blockDim.x)) {
    const int64_t c = tile * kTile + t;
    if (c >= channels) continue;
    float a = 0.0f, d = 0.0f;
    for (int k = 0; k < launch::kWarpsPerBlock; ++k) {
      a = math::Add(a, sw[k][t]);
      if constexpr (kTwo) d = math::Add(d, sb[k][t]);
    }
    pw[chunk * channels + c] = a;
    if constexpr (kTwo) pb[chunk * channels + c] = d;
  }
  __syncthreads();  // sw and sb read: the next tile may write them
}
// Block (tile, chunk) of the partials' grid.
template <ColumnSum kKind, typename T, int W>
static __global__ void ColumnPartialsKernel(float* pw, float* pb, const T* dout, const T* inp,
                                            const float* mean, const float* rstd, int64_t rows,
                                            int channels, int64_t rows_per_chunk) {
  ColumnPartialsTile<kKind, T, W>(pw, pb, dout, inp, mean, rstd, rows, channels, rows_per_chunk,
                                  blockIdx.x, blockIdx.y);
}

// dweight[c] += the chunks' partials pw[., c], dbias[c] += pb's (either may be null), a block's
// kFinishColumns columns a lane each: warp w adds chunks w, w + kWarpsPerBlock, ... in order, then
// the warps' sums are added in order ([Note: column sums]).
template <typename G>
static __global__ void ColumnFinishKernel(G* dweight, G* dbias, const float* pw, const float* pb,
                                          int64_t chunks, int channels) {
  static_assert(launch::kFinishColumns == 32, "ColumnFinishKernel: a lane a column");
  __shared__ float sw[launch::kWarpsPerBlock][launch::kFinishColumns];
  __shared__ float sb[launch::kWarpsPerBlock][launch::kFinishColumns];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t c = int64_t{blockIdx.x} * launch::kFinishColumns + lane;
  float a = 0.0f, d = 0.0f;
  if (c < channels) {
#pragma unroll 4
    for (int64_t k = warp; k < chunks; k += launch::kWarpsPerBlock) {
      if (dweight != nullptr) a = math::Add(a, pw[k * channels + c]);
      if (dbias != nullptr) d = math::Add(d, pb[k * channels + c]);
    }
  }
  sw[warp][lane] = a;
  sb[warp][lane] = d;
  __syncthreads();
  if (warp != 0 || c >= channels) return;
  a = d = 0.0f;
  for (int k = 0; k < launch::kWarpsPerBlock; ++k) {
    a = math::Add(a, sw[k][lane]);
    d = math::Add(d, sb[k][lane]);
  }
  if (dweight != nullptr) dweight[c] = FromFloat<G>(math::Add(ToFloat(dweight[c]), a));
  if (dbias != nullptr) dbias[c] = FromFloat<G>(math::Add(ToFloat(dbias[c]), d));
}

// ---- softmax cross-entropy: one block per row ------------------------------------------------

// The cross-entropy's block: a row's two passes (the maximum and the sum together, by an online
// softmax; then the gradient) read it twice. With blocks of 256 threads eight share an SM, 1056
// rows in flight on an H100/H200: 105 MB of GPT-2's bf16 rows of 50,304, twice the 50 MB L2, so
// a row would rarely stay there between its passes; with 1024 threads two share an SM, 264 rows
// (26 MB) in flight, and the second pass can find the row in L2 (llm.c's fused classifier takes
// 1024-thread blocks too). Not yet timed.
constexpr int kClassifierThreads = 1024;

// e^(x - m), m2 = math::Base2(m). fp32 logits by FastExp, the CPU's, so that an fp32 run's
// element arithmetic is the CPU's (a row's sum is in the device's own order). 16-bit logits by one
// fma in base 2 and the hardware's exp2 (kernels/cuda/exp2.cuh): their gradient is rounded to 8 or
// 11 bits, and FastExp's ~26 ALU instructions, twice a logit (the sum, the gradient) over GPT-2's 8
// x 1024 x 50,304 logits a micro-batch, are more than the kernel's memory traffic takes on an
// H100/H200.
template <typename T>
__device__ __forceinline__ float ExpShifted(float x, float m, float m2) {
  if constexpr (std::is_same_v<T, float>) {
    return math::FastExp(math::Sub(x, m));
  } else {
    return Ex2Approx(math::Fma(x, math::kLog2e, -m2));
  }
}

// The row's maximum and sum in one pass: [Note: the cross-entropy's online sum] in
// kernels/model_math.h. The columns from `valid` on are padding (GPT-2's 50,257 in rows of
// 50,304): read as -inf, a term of 0, and their gradient written 0.
// W: the logits a thread takes at a time (kVec where a row is whole 128-bit vectors and the
// logits 16-byte aligned, else 1); the element arithmetic is the same at both widths.
template <typename T, int W>
static __global__ void __launch_bounds__(kClassifierThreads)
    CrossEntropyKernel(T* logits, float* losses, const int32_t* targets, int vocab, int valid,
                       float scale) {
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  float x[W];
  const auto exp = [](float v, float m, float m2) { return ExpShifted<T>(v, m, m2); };
  math::OnlineLogSum t;
  for (int c = threadIdx.x * W; c < vocab; c += blockDim.x * W) {
    LoadN(z + c, x);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (c + e >= valid) x[e] = -INFINITY;
    }
    float vm = x[0];
#pragma unroll
    for (int e = 1; e < W; ++e) vm = fmaxf(vm, x[e]);
    t.Raise(vm, exp);
#pragma unroll
    for (int e = 0; e < W; ++e) t.Take(x[e], exp);
  }
  const float max = BlockMax<kClassifierThreads>(t.max);
  const float sum = BlockSum<kClassifierThreads>(t.SumAgainst(max, math::Base2(max), exp));
  const float log_sum = logf(sum);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = math::CrossEntropyLoss(ToFloat(z[target]), max, log_sum);
  __syncthreads();  // z[target] is read above before anyone overwrites it
  if (scale == 0.0f) return;
  const float shift = math::Add(max, log_sum), shift2 = math::Base2(shift);
  for (int c = threadIdx.x * W; c < vocab; c += blockDim.x * W) {
    LoadN(z + c, x);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      // math::CrossEntropyGrad's softmax(z) scale, its exp as above.
      const float g = math::Mul(ExpShifted<T>(x[e], shift, shift2), scale);
      x[e] = c + e >= valid ? 0.0f : c + e == target ? math::CrossEntropyTargetGrad(g, scale) : g;
    }
    StoreN(z + c, x);
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
  if (threadIdx.x == 0) losses[row] = math::VocabLoss(logf(sum), m, gsums[rows + row]);
  if (scale == 0.0f) return;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    if (v >= valid) {
      z[v] = FromFloat<T>(0.0f);
      continue;
    }
    z[v] = FromFloat<T>(
        math::VocabGrad(expf(ToFloat(z[v]) - m), sum, v + begin == targets[row], scale));
  }
}

}  // namespace
}  // namespace zerort
