// LAMB on CUDA: the moments pass (a grid-stride loop, each block's sums of p^2 and update^2
// reduced in shared memory and added atomically into the two f32 sums) and the apply pass.
// The element arithmetic is the CPU's own (kernels/optimizer_math.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/lamb.h"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

constexpr int kThreads = launch::kThreads;

int Blocks(int64_t n) { return launch::GridStrideBlocks(n, 1024); }

static __global__ void LambMomentsKernel(math::LambScalars a, const float* __restrict__ p,
                                         float* __restrict__ g, float* __restrict__ m,
                                         float* __restrict__ v, float* __restrict__ sums,
                                         int64_t n) {
  __shared__ float sw[kThreads], su[kThreads];
  float w = 0.0f, u = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float mi = m[i], vi = v[i];
    const float update = math::LambUpdate(a, p[i], g[i], mi, vi);
    m[i] = mi;
    v[i] = vi;
    g[i] = update;
    w += p[i] * p[i];
    u += update * update;
  }
  sw[threadIdx.x] = w;
  su[threadIdx.x] = u;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sw[threadIdx.x] += sw[threadIdx.x + s];
      su[threadIdx.x] += su[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&sums[0], sw[0]);
    atomicAdd(&sums[1], su[0]);
  }
}

template <typename Out>
static __global__ void LambApplyKernel(float step_coeff, float* __restrict__ p,
                                       const float* __restrict__ update, Out* __restrict__ out,
                                       int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float np = math::LambApplyElement(step_coeff, p[i], update[i]);
    p[i] = np;
    if (out != nullptr) out[i] = cuda::FromFloat<Out>(np);
  }
}

cudaStream_t Native(Stream* s) { return static_cast<cudaStream_t>(s->native_handle()); }

}  // namespace

namespace internal {

Status CudaLambMoments(const LambHyper& h, const float* p, float* g, float* m, float* v,
                       float* sums, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  const math::LambScalars a = math::MakeLambScalars(h);
  LambMomentsKernel<<<Blocks(n), kThreads, 0, Native(stream)>>>(a, p, g, m, v, sums, n);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CudaLambApply(float step_coeff, float* p, const float* update, void* out, DType out_dtype,
                     int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = Native(stream);
  if (out == nullptr || out_dtype == DType::kF32) {
    LambApplyKernel<float>
        <<<Blocks(n), kThreads, 0, s>>>(step_coeff, p, update, static_cast<float*>(out), n);
  } else if (out_dtype == DType::kBF16) {
    LambApplyKernel<__nv_bfloat16>
        <<<Blocks(n), kThreads, 0, s>>>(step_coeff, p, update, static_cast<__nv_bfloat16*>(out), n);
  } else {
    LambApplyKernel<__half>
        <<<Blocks(n), kThreads, 0, s>>>(step_coeff, p, update, static_cast<__half*>(out), n);
  }
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
