// CUDA reductions: a fixed grid of kReduceBlocks blocks each reduces a grid-stride slice in a
// fixed order and writes one partial; a second single-block kernel adds the partials in order to
// `out`. The result is deterministic (no float atomics). The partials live in stream-ordered
// memory (cudaMallocAsync), so no host synchronisation is needed; the device's default pool keeps
// them between steps instead of unmapping them at each synchronisation (MakeCudaCachingAllocator
// sets its release threshold), so each is a free-list pop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/reduce.h"
#include "zerort/kernels/rounded_math.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

constexpr int kReduceBlocks = 512;
constexpr int kThreads = launch::kThreads;

struct SquareOp {
  __device__ float operator()(float v) const { return v * v; }
};
struct NonFiniteOp {
  __device__ float operator()(float v) const { return math::IsFinite(v) ? 0.0f : 1.0f; }
};
struct ScaledOp {
  float factor;
  __device__ float operator()(float v) const { return v * factor; }
};

__device__ float BlockSum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename T, typename Op>
static __global__ void PartialKernel(const T* __restrict__ x, int64_t n,
                                     float* __restrict__ partial, Op op) {
  float acc = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    acc += op(cuda::ToFloat(x[i]));
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static __global__ void FinalKernel(const float* __restrict__ partial, float* __restrict__ out) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < kReduceBlocks; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc);
  if (threadIdx.x == 0) *out += acc;
}

template <typename T>
static __global__ void ScaleKernel(T* __restrict__ x, int64_t n, float factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = cuda::FromFloat<T>(cuda::ToFloat(x[i]) * factor);
  }
}

template <typename T>
static __global__ void AccumulateKernel(const T* __restrict__ src, float* __restrict__ dst,
                                        int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] += cuda::ToFloat(src[i]);
  }
}

template <typename Op>
static Status LaunchReduce(const void* x, DType dtype, int64_t n, float* out, Op op,
                           cudaStream_t s) {
  float* partial = nullptr;
  ZR_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&partial), kReduceBlocks * sizeof(float), s));
  switch (dtype) {
    case DType::kBF16:
      PartialKernel<<<kReduceBlocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n,
                                                       partial, op);
      break;
    case DType::kF16:
      PartialKernel<<<kReduceBlocks, kThreads, 0, s>>>(static_cast<const __half*>(x), n, partial,
                                                       op);
      break;
    default:
      PartialKernel<<<kReduceBlocks, kThreads, 0, s>>>(static_cast<const float*>(x), n, partial,
                                                       op);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FinalKernel<<<1, kThreads, 0, s>>>(partial, out);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ZR_CUDA_RETURN_IF_ERROR(cudaFreeAsync(partial, s));
  return absl::OkStatus();
}

}  // namespace

namespace internal {

Status CudaSumOfSquares(const void* x, DType dtype, int64_t n, float* out, Stream* stream) {
  return LaunchReduce(x, dtype, n, out, SquareOp{},
                      static_cast<cudaStream_t>(stream->native_handle()));
}

Status CudaCountNonFinite(const void* x, DType dtype, int64_t n, float* out, Stream* stream) {
  return LaunchReduce(x, dtype, n, out, NonFiniteOp{},
                      static_cast<cudaStream_t>(stream->native_handle()));
}

Status CudaSum(const void* x, DType dtype, int64_t n, float factor, float* out, Stream* stream) {
  return LaunchReduce(x, dtype, n, out, ScaledOp{factor},
                      static_cast<cudaStream_t>(stream->native_handle()));
}

Status CudaScale(void* x, DType dtype, int64_t n, float factor, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n, 4096);
  switch (dtype) {
    case DType::kBF16:
      ScaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(x), n, factor);
      break;
    case DType::kF16:
      ScaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<__half*>(x), n, factor);
      break;
    default:
      ScaleKernel<<<blocks, kThreads, 0, s>>>(static_cast<float*>(x), n, factor);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaAccumulateInto(const void* src, DType dtype, float* dst, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const int blocks = launch::GridStrideBlocks(n, 4096);
  switch (dtype) {
    case DType::kBF16:
      AccumulateKernel<<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n);
      break;
    case DType::kF16:
      AccumulateKernel<<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(src), dst, n);
      break;
    default:
      AccumulateKernel<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(src), dst, n);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
