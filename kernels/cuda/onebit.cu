// DeepSpeed's 1-bit Adam's element math and scaled-sign compression (kernels/onebit.h), on CUDA:
// grid-stride kernels over elements (the Adam phases, decoding) or bytes (compression: one thread
// packs eight signs). The element math is kernels/optimizer_math.h's, as on the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/onebit.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

constexpr int kThreads = launch::kThreads;

template <typename T>
__global__ void OneBitAdamKernel(OneBitAdamHyper h, OneBitPhase phase, float* p, const float* g,
                                 float* m, float* v, T* out, int64_t n) {
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (phase != OneBitPhase::kApply) {
      const float gi = math::Mul(g[i], h.grad_scale);
      m[i] = math::OneBitMomentum(m[i], gi, h.beta1, omb1);
      if (phase == OneBitPhase::kWarmup) v[i] = math::OneBitVariance(v[i], gi, h.beta2, omb2);
    }
    if (phase != OneBitPhase::kMomentum) {
      const float np = math::OneBitApply(p[i], m[i], v[i], h.lr, h.eps, h.weight_decay);
      p[i] = np;
      if (out != nullptr) out[i] = cuda::FromFloat<T>(np);
    }
  }
}

template <typename T>
__global__ void ZeroOneAdamKernel(OneBitAdamHyper h, float lrs, ZeroOnePhase phase, float* p,
                                  float* m, const float* v, float* acc, T* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float pi = p[i], ai = acc[i];
    if (phase == ZeroOnePhase::kLocalStep) {
      math::ZeroOneLocalStep(pi, ai, m[i], v[i], h.lr, h.eps, h.weight_decay);
    } else if (phase == ZeroOnePhase::kSyncOut) {
      math::ZeroOneSyncOut(pi, ai, v[i], h.eps);
    } else {
      float mi = m[i];
      math::ZeroOneSyncIn(pi, ai, mi, v[i], h.eps, lrs);
      m[i] = mi;
    }
    p[i] = pi;
    acc[i] = ai;
    if (out != nullptr) out[i] = cuda::FromFloat<T>(pi);
  }
}

__global__ void OneBitLambMomentumKernel(OneBitAdamHyper h, float scaling, const float* g,
                                         const float* m, float* fused, int64_t n) {
  const float omb1 = 1.0f - h.beta1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    fused[i] = math::OneBitLambFused(m[i], math::Mul(g[i], h.grad_scale), h.beta1, omb1, scaling);
  }
}

// Each block's sums and largest ratio reduced in shared memory, then added (the sums) and maxed
// (the ratio: non-negative floats order as their bits do) into `stats`.
__global__ void OneBitLambReconstructKernel(OneBitAdamHyper h, float scaling, const float* p,
                                            const float* fused, float* m, const float* v,
                                            float* v_fresh, float* update, float* stats,
                                            int64_t n) {
  __shared__ float s0[kThreads], s1[kThreads], s2[kThreads];
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  float a = 0.0f, b = 0.0f, r = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float mi = m[i], vf = v_fresh[i];
    const math::OneBitLambElement e = math::OneBitLambReconstruct(
        fused[i], scaling, mi, v[i], vf, p[i], h.beta1, omb1, h.beta2, omb2, h.eps, h.weight_decay);
    m[i] = mi;
    v_fresh[i] = vf;
    update[i] = e.update;
    a += e.prelim * e.prelim;
    b += e.update * e.update;
    r = fmaxf(r, e.ratio);
  }
  s0[threadIdx.x] = a;
  s1[threadIdx.x] = b;
  s2[threadIdx.x] = r;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      s0[threadIdx.x] += s0[threadIdx.x + k];
      s1[threadIdx.x] += s1[threadIdx.x + k];
      s2[threadIdx.x] = fmaxf(s2[threadIdx.x], s2[threadIdx.x + k]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&stats[0], s0[0]);
    atomicAdd(&stats[1], s1[0]);
    atomicMax(reinterpret_cast<int*>(&stats[2]), __float_as_int(s2[0]));
  }
}

__global__ void SignCompressKernel(float* b, int64_t bytes, float sqrt_n, const float* sum_sq,
                                   float* scale, uint8_t* bits, int64_t per_chunk,
                                   int64_t chunk_stride) {
  const float s = math::Div(math::Sqrt(*sum_sq), sqrt_n);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t byte = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; byte < bytes;
       byte += stride) {
    unsigned packed = 0;
    for (int k = 0; k < 8; ++k) {
      float& x = b[byte * 8 + k];
      const bool positive = !(x < 0.0f);
      packed |= positive ? 0x80u >> k : 0u;
      x = math::Sub(x, positive ? s : -s);
    }
    bits[byte / per_chunk * chunk_stride + byte % per_chunk] = static_cast<uint8_t>(packed);
  }
}

__global__ void SignDecodeKernel(const uint8_t* bits, int64_t bits_stride, const float* scales,
                                 int64_t scale_stride, int sources, float factor, bool accumulate,
                                 float* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += stride) {
    float sum = 0.0f;
    for (int w = 0; w < sources; ++w) {
      const bool positive = (bits[w * bits_stride + j / 8] >> (7 - j % 8)) & 1u;
      const float s = math::Mul(scales[w * scale_stride], factor);
      sum = math::Add(sum, positive ? s : -s);
    }
    out[j] = accumulate ? math::Add(sum, out[j]) : sum;
  }
}

}  // namespace

namespace internal {

Status CudaOneBitAdam(const OneBitAdamHyper& h, OneBitPhase phase, float* p, const float* g,
                      float* m, float* v, void* out, DType out_dtype, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n, 4096);
  switch (out_dtype) {
    case DType::kBF16:
      OneBitAdamKernel<<<blocks, kThreads, 0, s>>>(h, phase, p, g, m, v,
                                                   static_cast<__nv_bfloat16*>(out), n);
      break;
    case DType::kF16:
      OneBitAdamKernel<<<blocks, kThreads, 0, s>>>(h, phase, p, g, m, v, static_cast<__half*>(out),
                                                   n);
      break;
    default:
      OneBitAdamKernel<<<blocks, kThreads, 0, s>>>(h, phase, p, g, m, v, static_cast<float*>(out),
                                                   n);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaZeroOneAdam(const OneBitAdamHyper& h, float lrs, ZeroOnePhase phase, float* p, float* m,
                       const float* v, float* acc, void* out, DType out_dtype, int64_t n,
                       Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n, 4096);
  switch (out_dtype) {
    case DType::kBF16:
      ZeroOneAdamKernel<<<blocks, kThreads, 0, s>>>(h, lrs, phase, p, m, v, acc,
                                                    static_cast<__nv_bfloat16*>(out), n);
      break;
    case DType::kF16:
      ZeroOneAdamKernel<<<blocks, kThreads, 0, s>>>(h, lrs, phase, p, m, v, acc,
                                                    static_cast<__half*>(out), n);
      break;
    default:
      ZeroOneAdamKernel<<<blocks, kThreads, 0, s>>>(h, lrs, phase, p, m, v, acc,
                                                    static_cast<float*>(out), n);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaOneBitLambMomentum(const OneBitAdamHyper& h, float scaling, const float* g,
                              const float* m, float* fused, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  OneBitLambMomentumKernel<<<launch::GridStrideBlocks(n, 4096), kThreads, 0, s>>>(h, scaling, g, m,
                                                                                  fused, n);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaOneBitLambReconstruct(const OneBitAdamHyper& h, float scaling, const float* p,
                                 const float* fused, float* m, const float* v, float* v_fresh,
                                 float* update, float* stats, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  OneBitLambReconstructKernel<<<launch::GridStrideBlocks(n, 1024), kThreads, 0, s>>>(
      h, scaling, p, fused, m, v, v_fresh, update, stats, n);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaSignCompress(float* buffer, int64_t n, float sqrt_n, const float* sum_sq, float* scale,
                        uint8_t* bits, int64_t chunk, int64_t chunk_stride, Stream* stream) {
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n / 8, 4096);
  SignCompressKernel<<<blocks, kThreads, 0, s>>>(buffer, n / 8, sqrt_n, sum_sq, scale, bits,
                                                 chunk / 8, chunk_stride);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaSignDecode(const uint8_t* bits, int64_t bits_stride, const float* scales,
                      int64_t scale_stride, int sources, float factor, bool accumulate, float* out,
                      int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n, 4096);
  SignDecodeKernel<<<blocks, kThreads, 0, s>>>(bits, bits_stride, scales, scale_stride, sources,
                                               factor, accumulate, out, n);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
