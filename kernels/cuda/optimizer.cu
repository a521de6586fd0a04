// CUDA optimizer steps: one fused grid-stride pass over the range (read p, g, state; write p,
// state and the compute copy). Three layers: kernels, launchers on raw pointers and a stream,
// and the internal entries called by AdamStep/SgdStep after validation. Arithmetic mirrors the
// CPU element functions so the twins agree to rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/convert.cuh"
#include "kernels/optimizer.h"
#include "runtime/internal/cuda_check.h"

namespace zerort {
namespace {

struct AdamArgs {
  float beta1, beta2, eps, grad_scale, step_size, bias2_sqrt, decay_factor, l2;
};

struct SgdArgs {
  float lr, momentum, dampening, weight_decay, grad_scale;
  bool nesterov, first_step;
};

template <typename Out>
static __global__ void AdamKernel(AdamArgs a, float* __restrict__ p, const float* __restrict__ g,
                                  float* __restrict__ m, float* __restrict__ v,
                                  Out* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float grad = g[i] * a.grad_scale;
    float param = p[i];
    grad = fmaf(a.l2, param, grad);
    param *= a.decay_factor;
    float mi = m[i];
    mi += (1.0f - a.beta1) * (grad - mi);
    const float vi = v[i] * a.beta2 + (1.0f - a.beta2) * grad * grad;
    const float denom = sqrtf(vi) / a.bias2_sqrt + a.eps;
    param = param - a.step_size * (mi / denom);
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    if (out != nullptr) out[i] = cuda::FromFloat<Out>(param);
  }
}

template <typename Out>
static __global__ void SgdKernel(SgdArgs a, float* __restrict__ p, const float* __restrict__ g,
                                 float* __restrict__ buf, Out* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float param = p[i];
    float grad = g[i] * a.grad_scale;
    grad = fmaf(a.weight_decay, param, grad);
    if (a.momentum != 0.0f) {
      const float b = a.first_step ? grad : buf[i] * a.momentum + (1.0f - a.dampening) * grad;
      buf[i] = b;
      grad = a.nesterov ? grad + a.momentum * b : b;
    }
    param = param - a.lr * grad;
    p[i] = param;
    if (out != nullptr) out[i] = cuda::FromFloat<Out>(param);
  }
}

int Blocks(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

template <typename Out>
static cudaError_t LaunchAdam(const AdamArgs& a, float* p, const float* g, float* m, float* v,
                              void* out, int64_t n, cudaStream_t s) {
  AdamKernel<Out><<<Blocks(n, 256), 256, 0, s>>>(a, p, g, m, v, static_cast<Out*>(out), n);
  return cudaGetLastError();
}

template <typename Out>
static cudaError_t LaunchSgd(const SgdArgs& a, float* p, const float* g, float* buf, void* out,
                             int64_t n, cudaStream_t s) {
  SgdKernel<Out><<<Blocks(n, 256), 256, 0, s>>>(a, p, g, buf, static_cast<Out*>(out), n);
  return cudaGetLastError();
}

}  // namespace

namespace internal {

Status CudaAdam(const AdamHyper& h, float* p, const float* g, float* m, float* v, void* out,
                DType out_dtype, int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  const double t = static_cast<double>(h.step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), t) : 1.0;
  const AdamArgs a{
      h.beta1,
      h.beta2,
      h.eps,
      h.grad_scale,
      static_cast<float>(h.lr / bc1),
      static_cast<float>(std::sqrt(bc2)),
      h.decoupled ? static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay) : 1.0f,
      h.decoupled ? 0.0f : h.weight_decay};
  auto s = static_cast<cudaStream_t>(stream->native_handle());
  cudaError_t err;
  if (out == nullptr || out_dtype == DType::kF32) {
    err = LaunchAdam<float>(a, p, g, m, v, out, n, s);
  } else if (out_dtype == DType::kBF16) {
    err = LaunchAdam<__nv_bfloat16>(a, p, g, m, v, out, n, s);
  } else {
    err = LaunchAdam<__half>(a, p, g, m, v, out, n, s);
  }
  if (err != cudaSuccess) return CudaError("AdamKernel launch", err);
  return absl::OkStatus();
}

Status CudaSgd(const SgdHyper& h, float* p, const float* g, float* buf, void* out, DType out_dtype,
               int64_t n, Stream* stream) {
  if (n == 0) return absl::OkStatus();
  const SgdArgs a{h.lr,         h.momentum, h.dampening, h.weight_decay,
                  h.grad_scale, h.nesterov, h.step <= 1};
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
