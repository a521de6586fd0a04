// CUDA optimizer steps: one fused grid-stride pass (read p, g, state; write p, state and the
// compute copy) over the range (SGD) or over up to kAdamSegmentsPerLaunch ranges (Adam, AdamW:
// AdamStep is one range). Three
// layers: kernels, launchers on raw pointers and a stream, and the internal entries called by
// AdamStep/SgdStep after validation. The arithmetic is the CPU loops' own
// (kernels/optimizer_math.h), so the twins agree bitwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/launch_geometry.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

// Up to kAdamSegmentsPerLaunch ranges of the same buffers, each with its own scalars (its weight
// decay), by value in the kernel's parameters (under 2 KB): block row y runs segment y with a
// grid-stride loop, each element through math::AdamElement.
struct AdamSegmentTable {
  int n = 0;
  math::AdamScalars scalars[kAdamSegmentsPerLaunch];
  int64_t begin[kAdamSegmentsPerLaunch];
  int64_t count[kAdamSegmentsPerLaunch];
};

template <typename Out>
static __global__ void AdamSegmentsKernel(AdamSegmentTable t, float* __restrict__ p,
                                          const float* __restrict__ g, float* __restrict__ m,
                                          float* __restrict__ v, Out* __restrict__ out) {
  const int y = static_cast<int>(blockIdx.y);
  const math::AdamScalars a = t.scalars[y];
  const int64_t begin = t.begin[y], n = t.count[y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += stride) {
    const int64_t i = begin + j;
    float mi = m[i], vi = v[i];
    const float param = math::AdamElement(a, p[i], g[i], mi, vi);
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    if (out != nullptr) out[i] = cuda::FromFloat<Out>(param);
  }
}

template <typename Out>
static __global__ void SgdKernel(math::SgdScalars s, float* __restrict__ p,
                                 const float* __restrict__ g, float* __restrict__ buf,
                                 Out* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float d = math::SgdGradient(s, p[i], g[i]);
    float b = 0.0f;
    if (s.momentum != 0.0f) {
      b = math::SgdMomentum(s, buf[i], d);
      buf[i] = b;
    }
    const float param = math::SgdApply(s, p[i], d, b);
    p[i] = param;
    if (out != nullptr) out[i] = cuda::FromFloat<Out>(param);
  }
}

int Blocks(int64_t n, int threads) { return launch::GridStrideBlocks(n, 4096, threads); }

template <typename Out>
static cudaError_t LaunchAdamSegments(const AdamSegmentTable& t, float* p, const float* g, float* m,
                                      float* v, void* out, cudaStream_t s) {
  int64_t longest = 0;
  for (int k = 0; k < t.n; ++k) longest = t.count[k] > longest ? t.count[k] : longest;
  // Enough blocks per segment for the longest, at most 4096 in all rows together.
  const int per_row = Blocks(longest, 256) < 4096 / t.n ? Blocks(longest, 256) : 4096 / t.n;
  const dim3 grid(static_cast<unsigned>(per_row > 0 ? per_row : 1), static_cast<unsigned>(t.n));
  AdamSegmentsKernel<Out><<<grid, 256, 0, s>>>(t, p, g, m, v, static_cast<Out*>(out));
  return cudaGetLastError();
}

template <typename Out>
static cudaError_t LaunchSgd(const math::SgdScalars& a, float* p, const float* g, float* buf,
                             void* out, int64_t n, cudaStream_t s) {
  SgdKernel<Out><<<Blocks(n, 256), 256, 0, s>>>(a, p, g, buf, static_cast<Out*>(out), n);
  return cudaGetLastError();
}

}  // namespace

namespace internal {

Status CudaAdamSegments(const AdamHyper& h, std::span<const OptimizerSegment> segments, float* p,
                        const float* g, float* m, float* v, void* out, DType out_dtype,
                        Stream* stream) {
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  AdamSegmentTable t;
  auto flush = [&]() -> Status {
    if (t.n == 0) return absl::OkStatus();
    cudaError_t err;
    if (out == nullptr || out_dtype == DType::kF32) {
      err = LaunchAdamSegments<float>(t, p, g, m, v, out, s);
    } else if (out_dtype == DType::kBF16) {
      err = LaunchAdamSegments<__nv_bfloat16>(t, p, g, m, v, out, s);
    } else {
      err = LaunchAdamSegments<__half>(t, p, g, m, v, out, s);
    }
    t.n = 0;
    if (err != cudaSuccess) return CudaError("AdamSegmentsKernel launch", err);
    return absl::OkStatus();
  };
  for (const OptimizerSegment& seg : segments) {
    if (seg.count == 0) continue;
    AdamHyper hs = h;
    hs.weight_decay = seg.weight_decay;
    t.scalars[t.n] = math::MakeAdamScalars(hs);
    t.begin[t.n] = seg.begin;
    t.count[t.n] = seg.count;
    if (++t.n == kAdamSegmentsPerLaunch) ZR_RETURN_IF_ERROR(flush());
  }
  return flush();
}

Status CudaSgd(const SgdHyper& h, float* p, const float* g, float* buf, void* out, DType out_dtype,
               int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  const math::SgdScalars a = math::MakeSgdScalars(h);
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  cudaError_t err;
  if (out == nullptr || out_dtype == DType::kF32) {
    err = LaunchSgd<float>(a, p, g, buf, out, n, s);
  } else if (out_dtype == DType::kBF16) {
    err = LaunchSgd<__nv_bfloat16>(a, p, g, buf, out, n, s);
  } else {
    err = LaunchSgd<__half>(a, p, g, buf, out, n, s);
  }
  if (err != cudaSuccess) return CudaError("SgdKernel launch", err);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace zerort
