// ModelKernels on CUDA: the GPT model's operations for fp32, bf16 or fp16 activations/weights and
// fp32 or bf16 weight gradients, fp32 accumulation everywhere. GEMMs of the linear layers through
// cuBLASLt (bias fused as an epilogue in the forward; gradients accumulated with beta = 1);
// attention built on strided-batched cuBLAS GEMMs with a causal softmax kernel between them (the
// correct-first version; a fused flash-style kernel is the follow-up); the element-wise ops,
// LayerNorm and the fused softmax cross-entropy as kernels here. Same three layers per op as the
// rest of kernels/cuda: a static __global__ kernel, a launcher on raw pointers and a stream, and
// the public method that validates and returns Status.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/convert.cuh"
#include "kernels/model_kernels.h"
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
constexpr size_t kLtWorkspace = 32u << 20;  // cuBLASLt's recommendation for Hopper

// Grid of a grid-stride loop over n elements.
int Blocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}
// Grid of a warp-per-row kernel (no grid-stride loop: every row gets its warp).
unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads);
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

// ---- the interface ---------------------------------------------------------------------------

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

struct LtDeleter {
  void operator()(cublasLtContext* h) const { cublasLtDestroy(h); }
};
struct BlasDeleter {
  void operator()(cublasContext* h) const { cublasDestroy(h); }
};

template <typename T, typename G>
class CudaModelKernels final : public ModelKernels {
 public:
  CudaModelKernels(Stream& stream, Allocator& workspace, DType act, DType grad)
      : stream_(stream), ws_(workspace), act_(act), grad_(grad) {}

  Status Init() {
    cublasLtHandle_t lt = nullptr;
    ZR_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&lt));
    lt_.reset(lt);
    cublasHandle_t blas = nullptr;
    ZR_CUBLAS_RETURN_IF_ERROR(cublasCreate(&blas));
    blas_.reset(blas);
    ZR_CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas, s()));
    // fp32 stays fp32 (no TF32): the CPU twin is the reference.
    ZR_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    ZR_ASSIGN_OR_RETURN(lt_workspace_,
                        ws_.Allocate(kLtWorkspace, MemoryCategory::kWorkspace, &stream_));
    return absl::OkStatus();
  }

  Device device() const override { return stream_.device(); }
  Stream& stream() override { return stream_; }
  size_t act_size() const override { return sizeof(T); }
  size_t grad_size() const override { return sizeof(G); }
  size_t stat_size() const override { return sizeof(float); }
  std::optional<DType> act_dtype() const override { return act_; }
  std::optional<DType> grad_dtype() const override { return grad_; }
  std::optional<DType> stat_dtype() const override { return DType::kF32; }

  Status ActToHost(const void* src, int64_t n, double* out) override {
    std::vector<T> host(n);
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, s()));
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(static_cast<float>(host[i]));
    return absl::OkStatus();
  }
  Status StatToHost(const void* src, int64_t n, double* out) override {
    std::vector<float> host(n);
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost, s()));
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s()));
    std::copy(host.begin(), host.end(), out);
    return absl::OkStatus();
  }

  Status Embedding(void* out, const int32_t* tokens, const void* wte, const void* wpe, int batch,
                   int seq, int channels, int vocab_begin, int vocab_count) override {
    const int64_t n = int64_t{batch} * seq * channels;
    EmbeddingKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), tokens, A(wte), A(wpe), seq,
                                                        channels, vocab_begin, vocab_count, n);
    return Launched("Embedding");
  }
  Status EmbeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                           int batch, int seq, int channels, int vocab_begin,
                           int vocab_count) override {
    const int64_t n = int64_t{batch} * seq * channels;
    EmbeddingBackwardKernel<T, G><<<Blocks(n), kThreads, 0, s()>>>(
        Gp(dwte), Gp(dwpe), A(dout), tokens, seq, channels, vocab_begin, vocab_count, n);
    return Launched("EmbeddingBackward");
  }

  Status LayerNorm(void* out, void* mean, void* rstd, const void* inp, const void* weight,
                   const void* bias, int64_t rows, int channels) override {
    LayerNormKernel<T><<<RowBlocks(rows), kThreads, 0, s()>>>(A(out), static_cast<float*>(mean),
                                                              static_cast<float*>(rstd), A(inp),
                                                              A(weight), A(bias), rows, channels);
    return Launched("LayerNorm");
  }
  Status LayerNormBackward(void* dinp, void* dweight, void* dbias, const void* dout,
                           const void* inp, const void* weight, const void* mean, const void* rstd,
                           int64_t rows, int channels) override {
    ZR_ASSIGN_OR_RETURN(Buffer dwb, Scratch(2 * channels * sizeof(float)));
    ZR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dwb.data(), 0, dwb.bytes(), s()));
    LayerNormBackwardKernel<T><<<RowBlocks(rows), kThreads, 0, s()>>>(
        A(dinp), dwb.as<float>(), A(dout), A(inp), A(weight), static_cast<const float*>(mean),
        static_cast<const float*>(rstd), rows, channels);
    ZR_RETURN_IF_ERROR(Launched("LayerNormBackward"));
    if (dweight != nullptr) {
      AccumulateKernel<G, float>
          <<<Blocks(channels), kThreads, 0, s()>>>(Gp(dweight), dwb.as<float>(), channels);
    }
    if (dbias != nullptr) {
      AccumulateKernel<G, float>
          <<<Blocks(channels), kThreads, 0, s()>>>(Gp(dbias), dwb.as<float>() + channels, channels);
    }
    return Launched("LayerNormBackward (weights)");
  }

  Status Matmul(void* out, const void* inp, const void* weight, const void* bias, int64_t rows,
                int in, int out_features) override {
    // Column-major view: out^T [out, rows] = W [out, in] (stored [in, out]^T) x inp^T [in, rows].
    return LtMatmul(true, false, out_features, rows, in, weight, CudaType<T>(), in, inp,
                    CudaType<T>(), in, out, CudaType<T>(), out_features, 0.0f, bias);
  }
  Status MatmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                        const void* weight, int64_t rows, int in, int out_features) override {
    if (dinp != nullptr) {  // dinp^T [in, rows] += W^T [in, out] x dout^T [out, rows]
      ZR_RETURN_IF_ERROR(LtMatmul(false, false, in, rows, out_features, weight, CudaType<T>(), in,
                                  dout, CudaType<T>(), out_features, dinp, CudaType<T>(), in, 1.0f,
                                  nullptr));
    }
    if (dweight != nullptr) {  // dW^T [in, out] += inp^T [in, rows] x dout [rows, out]
      ZR_RETURN_IF_ERROR(LtMatmul(false, true, in, out_features, rows, inp, CudaType<T>(), in, dout,
                                  CudaType<T>(), out_features, dweight, CudaType<G>(), in, 1.0f,
                                  nullptr));
    }
    if (dbias != nullptr) {
      BiasGradKernel<T, G>
          <<<out_features, kThreads, 0, s()>>>(Gp(dbias), A(dout), rows, out_features);
      ZR_RETURN_IF_ERROR(Launched("BiasGrad"));
    }
    return absl::OkStatus();
  }

  Status Attention(void* out, void* att, const void* qkv, int batch, int seq, int channels,
                   int heads) override {
    const int hs = channels / heads;
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t bh = int64_t{batch} * heads;
    ZR_ASSIGN_OR_RETURN(Buffer q, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer k, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer v, Scratch(n * sizeof(T)));
    SplitHeadsKernel<T><<<Blocks(n), kThreads, 0, s()>>>(q.as<T>(), k.as<T>(), v.as<T>(), A(qkv),
                                                         batch, seq, heads, hs);
    ZR_RETURN_IF_ERROR(Launched("SplitHeads"));
    ZR_ASSIGN_OR_RETURN(Buffer preatt, Scratch(bh * seq * seq * sizeof(T)));
    // preatt[b,h] [T, T] = q [T, HS] x k^T
    ZR_RETURN_IF_ERROR(BatchedGemm(false, true, seq, seq, hs, 1.0f, q.data(), hs, int64_t{seq} * hs,
                                   k.data(), hs, int64_t{seq} * hs, 0.0f, preatt.data(), seq,
                                   int64_t{seq} * seq, bh));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    CausalSoftmaxKernel<T>
        <<<RowBlocks(bh * seq), kThreads, 0, s()>>>(A(att), preatt.as<T>(), bh * seq, seq, scale);
    ZR_RETURN_IF_ERROR(Launched("CausalSoftmax"));
    // y [T, HS] = att [T, T] x v [T, HS]; y reuses q's memory.
    ZR_RETURN_IF_ERROR(BatchedGemm(false, false, seq, hs, seq, 1.0f, att, seq, int64_t{seq} * seq,
                                   v.data(), hs, int64_t{seq} * hs, 0.0f, q.data(), hs,
                                   int64_t{seq} * hs, bh));
    HeadsLayoutKernel<T>
        <<<Blocks(n), kThreads, 0, s()>>>(A(out), q.as<T>(), batch, seq, heads, hs, true);
    return Launched("HeadsLayout");
  }

  // Saves the probabilities (ModelKernels' default AttentionSavedBytes); `out` is not needed.
  Status AttentionBackward(void* dqkv, const void* dout, const void* qkv, const void* /*out*/,
                           const void* att, int batch, int seq, int channels, int heads) override {
    const int hs = channels / heads;
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t bh = int64_t{batch} * heads;
    const int64_t ths = int64_t{seq} * hs, tt = int64_t{seq} * seq;
    ZR_ASSIGN_OR_RETURN(Buffer q, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer k, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer v, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer dy, Scratch(n * sizeof(T)));
    ZR_ASSIGN_OR_RETURN(Buffer datt, Scratch(bh * tt * sizeof(T)));
    SplitHeadsKernel<T><<<Blocks(n), kThreads, 0, s()>>>(q.as<T>(), k.as<T>(), v.as<T>(), A(qkv),
                                                         batch, seq, heads, hs);
    HeadsLayoutKernel<T>
        <<<Blocks(n), kThreads, 0, s()>>>(dy.as<T>(), A(dout), batch, seq, heads, hs, false);
    ZR_RETURN_IF_ERROR(Launched("AttentionBackward layouts"));
    // datt [T, T] = dy [T, HS] x v^T
    ZR_RETURN_IF_ERROR(BatchedGemm(false, true, seq, seq, hs, 1.0f, dy.data(), hs, ths, v.data(),
                                   hs, ths, 0.0f, datt.data(), seq, tt, bh));
    // dv [T, HS] = att^T [T, T] x dy (written over v, which is no longer needed)
    ZR_RETURN_IF_ERROR(BatchedGemm(true, false, seq, hs, seq, 1.0f, att, seq, tt, dy.data(), hs,
                                   ths, 0.0f, v.data(), hs, ths, bh));
    CausalSoftmaxBackwardKernel<T>
        <<<RowBlocks(bh * seq), kThreads, 0, s()>>>(datt.as<T>(), A(att), bh * seq, seq);
    ZR_RETURN_IF_ERROR(Launched("CausalSoftmaxBackward"));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // dq [T, HS] = scale dscore [T, T] x k (into dy); dk = scale dscore^T x q (into k... after q
    // is read: dk goes to a fresh buffer).
    ZR_ASSIGN_OR_RETURN(Buffer dk, Scratch(n * sizeof(T)));
    ZR_RETURN_IF_ERROR(BatchedGemm(false, false, seq, hs, seq, scale, datt.data(), seq, tt,
                                   k.data(), hs, ths, 0.0f, dy.data(), hs, ths, bh));
    ZR_RETURN_IF_ERROR(BatchedGemm(true, false, seq, hs, seq, scale, datt.data(), seq, tt, q.data(),
                                   hs, ths, 0.0f, dk.data(), hs, ths, bh));
    MergeHeadGradsKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(dqkv), dy.as<T>(), dk.as<T>(),
                                                             v.as<T>(), batch, seq, heads, hs);
    return Launched("MergeHeadGrads");
  }

  Status Gelu(void* out, const void* inp, int64_t n) override {
    GeluKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), A(inp), n);
    return Launched("Gelu");
  }
  Status GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override {
    GeluBackwardKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(dinp), A(inp), A(dout), n);
    return Launched("GeluBackward");
  }
  Status Add(void* out, const void* a, const void* b, int64_t n) override {
    AddKernel<T><<<Blocks(n), kThreads, 0, s()>>>(A(out), A(a), A(b), n);
    return Launched("Add");
  }
  Status Accumulate(void* dst, const void* src, int64_t n) override {
    AccumulateKernel<T, T><<<Blocks(n), kThreads, 0, s()>>>(A(dst), A(src), n);
    return Launched("Accumulate");
  }
  Status AccumulateGrad(void* dst, const void* src, int64_t n) override {
    AccumulateKernel<G, G><<<Blocks(n), kThreads, 0, s()>>>(Gp(dst), Gp(src), n);
    return Launched("AccumulateGrad");
  }
  Status VocabMax(const void* logits, void* max, int64_t rows, int vocab, int valid) override {
    VocabMaxKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<float*>(max), vocab, valid);
    return Launched("VocabMax");
  }
  Status VocabSums(const void* logits, const void* gmax, const int32_t* targets, void* sums,
                   int64_t rows, int vocab, int valid, int begin) override {
    VocabSumsKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<const float*>(gmax), targets, static_cast<float*>(sums), rows, vocab,
        valid, begin);
    return Launched("VocabSums");
  }
  Status VocabCrossEntropyFinish(void* logits, void* losses, const void* gmax, const void* gsums,
                                 const int32_t* targets, int64_t rows, int vocab, int valid,
                                 int begin, float dscale) override {
    VocabFinishKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<float*>(losses), static_cast<const float*>(gmax),
        static_cast<const float*>(gsums), targets, rows, vocab, valid, begin, dscale);
    return Launched("VocabCrossEntropyFinish");
  }
  Status AddBias(void* out, const void* bias, int64_t rows, int cols) override {
    AddBiasKernel<T><<<Blocks(rows * cols), kThreads, 0, s()>>>(A(out), A(bias), rows, cols);
    return Launched("AddBias");
  }
  Status CrossEntropy(void* logits, void* losses, const int32_t* targets, int64_t rows, int vocab,
                      float dscale) override {
    CrossEntropyKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s()>>>(
        A(logits), static_cast<float*>(losses), targets, vocab, dscale);
    return Launched("CrossEntropy");
  }

 private:
  cudaStream_t s() const { return static_cast<cudaStream_t>(stream_.native_handle()); }
  static T* A(void* p) { return static_cast<T*>(p); }
  static const T* A(const void* p) { return static_cast<const T*>(p); }
  static G* Gp(void* p) { return static_cast<G*>(p); }
  static const G* Gp(const void* p) { return static_cast<const G*>(p); }
  StatusOr<Buffer> Scratch(size_t bytes) {
    return ws_.Allocate(bytes, MemoryCategory::kWorkspace, &stream_);
  }
  static Status Launched(const char* what) {
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
      return internal::CudaError(what, err);
    }
    return absl::OkStatus();
  }

  // Column-major D [m, n] = alpha op(A) [m, k] x op(B) [k, n] + beta D, fp32 compute; with
  // `bias` (length m, D's type) fused as the epilogue.
  Status LtMatmul(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type,
                  int64_t ldb, void* d, cudaDataType_t d_type, int64_t ldd, float beta,
                  const void* bias) {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    Status status = [&]() -> Status {
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      ZR_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      ZR_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      if (bias != nullptr) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                                 &epilogue, sizeof(epilogue)));
        ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
            op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        const cudaDataType_t bias_type = d_type;
        ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
            op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
      }
      ZR_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatrixLayoutCreate(&la, a_type, trans_a ? k : m, trans_a ? m : k, lda));
      ZR_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatrixLayoutCreate(&lb, b_type, trans_b ? n : k, trans_b ? k : n, ldb));
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, ldd));
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
      const size_t ws = lt_workspace_.bytes();
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      cublasLtMatmulHeuristicResult_t heuristic{};
      int found = 0;
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(lt_.get(), op, la, lb, ld, ld, pref,
                                                               1, &heuristic, &found));
      if (found == 0) {
        return absl::InternalError("cuBLASLt has no algorithm for the " + std::to_string(m) + "x" +
                                   std::to_string(n) + "x" + std::to_string(k) +
                                   " matmul (transa " + std::to_string(trans_a) + ", transb " +
                                   std::to_string(trans_b) + ")");
      }
      const float alpha = 1.0f;
      ZR_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(lt_.get(), op, &alpha, a, la, b, lb, &beta, d, ld, d,
                                               ld, &heuristic.algo, lt_workspace_.data(), ws, s()));
      return absl::OkStatus();
    }();
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (ld != nullptr) cublasLtMatrixLayoutDestroy(ld);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    return status;
  }

  // Row-major, batched: C[i] [M, N] = alpha op(A[i]) [M, K] x op(B[i]) [K, N] + beta C[i], with
  // leading dimensions of the stored (row-major) matrices. cuBLAS is column-major, so it computes
  // C^T = op(B)^T op(A)^T.
  Status BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                     int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b,
                     float beta, void* c, int ldc, int64_t stride_c, int64_t batch) {
    ZR_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        blas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
        k, &alpha, b, CudaType<T>(), ldb, stride_b, a, CudaType<T>(), lda, stride_a, &beta, c,
        CudaType<T>(), ldc, stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }

  Stream& stream_;
  Allocator& ws_;
  const DType act_, grad_;  // T's and G's DType, as the collectives name them
  std::unique_ptr<cublasLtContext, LtDeleter> lt_;
  std::unique_ptr<cublasContext, BlasDeleter> blas_;
  Buffer lt_workspace_;
};

template <typename T, typename G>
StatusOr<std::unique_ptr<ModelKernels>> Make(Stream& stream, Allocator& workspace) {
  auto k = std::make_unique<CudaModelKernels<T, G>>(stream, workspace, DTypeOfCuda<T>(),
                                                    DTypeOfCuda<G>());
  ZR_RETURN_IF_ERROR(k->Init());
  return std::unique_ptr<ModelKernels>(std::move(k));
}

}  // namespace

StatusOr<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(DType act, DType grad, Stream& stream,
                                                             Allocator& workspace) {
  if (!stream.device().is_cuda() || workspace.device() != stream.device()) {
    return absl::InvalidArgumentError(
        "MakeCudaModelKernels needs a CUDA stream and an allocator "
        "on the same device");
  }
  // cuBLASLt writes a bf16 or fp32 result from bf16 inputs, but not bf16 from fp32 inputs.
  if (act == DType::kF32 && grad == DType::kF32) return Make<float, float>(stream, workspace);
  if (act == DType::kBF16 && grad == DType::kF32) return Make<bf16, float>(stream, workspace);
  if (act == DType::kBF16 && grad == DType::kBF16) return Make<bf16, bf16>(stream, workspace);
  if (act == DType::kF16 && grad == DType::kF32) return Make<f16, float>(stream, workspace);
  return absl::InvalidArgumentError(
      std::string("the GPT model's CUDA kernels take f32/f32, bf16/f32, bf16/bf16 or f16/f32 "
                  "activations/"
                  "gradients, not ") +
      std::string(DTypeName(act)) + "/" + std::string(DTypeName(grad)));
}

}  // namespace zerort
