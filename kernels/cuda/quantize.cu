// [Note: block quantization] (kernels/quantize.h), on CUDA: one block per group finds the
// group's max |x| (a shared-memory tree), then quantizes it; dequantization is grid-stride.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/quantize.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

constexpr int kThreads = launch::kThreads;

template <typename T>
__global__ void QuantizeKernel(const T* __restrict__ x, int64_t n, int64_t size,
                               int8_t* __restrict__ q, float* __restrict__ scales) {
  __shared__ float tree[kThreads];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * size, end = begin + size;
  float absmax = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    absmax = fmaxf(absmax, fabsf(cuda::ToFloat(x[i])));
  }
  tree[threadIdx.x] = absmax;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) tree[threadIdx.x] = fmaxf(tree[threadIdx.x], tree[threadIdx.x + half]);
    __syncthreads();
  }
  const float s = tree[0] > 0.0f ? tree[0] / 127.0f : 1.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float r = rintf(cuda::ToFloat(x[i]) / s);
    q[i] = static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f));
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
}

template <typename T>
__global__ void DequantizeKernel(const int8_t* __restrict__ q, const float* __restrict__ scales,
                                 int64_t n, int64_t size, T* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = cuda::FromFloat<T>(static_cast<float>(q[i]) * scales[i / size]);
  }
}

}  // namespace

namespace internal {

Status CudaQuantizeInt8(const void* x, DType dtype, int64_t n, int64_t groups, void* packed,
                        Stream* stream) {
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  auto* q = static_cast<int8_t*>(packed);
  auto* scales = reinterpret_cast<float*>(q + n);
  const int64_t size = n / groups;
  const auto blocks = static_cast<unsigned>(groups);
  switch (dtype) {
    case DType::kBF16:
      QuantizeKernel<<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n, size, q,
                                                 scales);
      break;
    case DType::kF16:
      QuantizeKernel<<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(x), n, size, q, scales);
      break;
    default:
      QuantizeKernel<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(x), n, size, q, scales);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaDequantizeInt8(const void* packed, int64_t n, int64_t groups, void* out, DType dtype,
                          Stream* stream) {
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  const auto* q = static_cast<const int8_t*>(packed);
  const auto* scales = reinterpret_cast<const float*>(q + n);
  const int64_t size = n / groups;
  const int blocks = launch::GridStrideBlocks(n, 4096);
  switch (dtype) {
    case DType::kBF16:
      DequantizeKernel<<<blocks, kThreads, 0, s>>>(q, scales, n, size,
                                                   static_cast<__nv_bfloat16*>(out));
      break;
    case DType::kF16:
      DequantizeKernel<<<blocks, kThreads, 0, s>>>(q, scales, n, size, static_cast<__half*>(out));
      break;
    default:
      DequantizeKernel<<<blocks, kThreads, 0, s>>>(q, scales, n, size, static_cast<float*>(out));
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
