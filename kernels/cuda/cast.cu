// CUDA casts: one grid-stride pass over the buffer. Three layers: the
// kernel, a launcher on raw pointers and a stream, and the entry called by Cast().
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zerort/kernels/cast.h"
#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

using cuda::FromFloat;
using cuda::ToFloat;

template <typename In, typename Out>
static __global__ void CastKernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = FromFloat<Out>(ToFloat<In>(src[i]));
  }
}

template <typename In, typename Out>
static cudaError_t LaunchCast(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<In, Out><<<launch::GridStrideBlocks(n, 65536), launch::kThreads, 0, stream>>>(
      static_cast<const In*>(src), static_cast<Out*>(dst), n);
  return cudaGetLastError();
}

template <typename In>
static cudaError_t LaunchFrom(const void* src, DType d, void* dst, int64_t n, cudaStream_t s) {
  switch (d) {
    case DType::kF32:
      return LaunchCast<In, float>(src, dst, n, s);
    case DType::kBF16:
      return LaunchCast<In, __nv_bfloat16>(src, dst, n, s);
    default:
      return LaunchCast<In, __half>(src, dst, n, s);
  }
}

}  // namespace

namespace internal {

Status CudaCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                Stream* stream) {
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  cudaError_t err;
  switch (src_dtype) {
    case DType::kF32:
      err = LaunchFrom<float>(src, dst_dtype, dst, n, s);
      break;
    case DType::kBF16:
      err = LaunchFrom<__nv_bfloat16>(src, dst_dtype, dst, n, s);
      break;
    default:
      err = LaunchFrom<__half>(src, dst_dtype, dst, n, s);
      break;
  }
  if (err != cudaSuccess) return CudaError("CastKernel launch", err);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
