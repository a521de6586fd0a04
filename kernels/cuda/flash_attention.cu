// The CUDA executor of flash attention's block programs (kernels/flash_tiles.h): each thread runs
// the program's functions for its own index, products are wmma 16 x 16 x 16 tiles (bf16 or fp16
// in, fp32 accumulators) through shared memory, copies are 16-byte vector loads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/flash_tiles.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

namespace wmma = nvcuda::wmma;

template <typename E>
struct CudaExec {
  using Elem = E;
  __device__ static float ToF(E v) { return cuda::ToFloat<E>(v); }
  __device__ static E FromF(float v) { return cuda::FromFloat<E>(v); }
  template <typename F>
  __device__ void ForThreads(F&& f) const {
    f(static_cast<int>(threadIdx.x));
  }
  template <typename F>
  __device__ void ForWarps(F&& f) const {
    f(static_cast<int>(threadIdx.x) / 32);
  }
  template <typename F>
  __device__ void ForLanes(F&& f) const {
    f(static_cast<int>(threadIdx.x) % 32);
  }
  __device__ void SyncBlock() const { __syncthreads(); }
  __device__ void SyncWarp() const { __syncwarp(); }
  __device__ static void Copy16(void* dst, const void* src) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  }
  __device__ static void Zero16(void* dst) { *static_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0); }

  template <typename Layout>
  __device__ static void Product(float* c, int ldc, const E* a, int lda, const E* b, int ldb,
                                 int k_steps, bool accumulate, bool col_b) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, Layout> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    if (accumulate) {
      wmma::load_matrix_sync(fc, c, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(fc, 0.0f);
    }
    for (int kk = 0; kk < k_steps; ++kk) {
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, col_b ? b + kk * 16 : b + kk * 16 * ldb, ldb);
      wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(c, fc, ldc, wmma::mem_row_major);
  }
  __device__ void Mma(flash::ColB, float* c, int ldc, const E* a, int lda, const E* b, int ldb,
                      int k_steps, bool accumulate) const {
    Product<wmma::col_major>(c, ldc, a, lda, b, ldb, k_steps, accumulate, true);
  }
  __device__ void Mma(flash::RowB, float* c, int ldc, const E* a, int lda, const E* b, int ldb,
                      int k_steps, bool accumulate) const {
    Product<wmma::row_major>(c, ldc, a, lda, b, ldb, k_steps, accumulate, false);
  }
};

template <int D, typename E>
__global__ void __launch_bounds__(flash::kThreads)
    ForwardKernel(const E* qkv, E* out, float* lse, flash::Shape sh) {
  extern __shared__ __align__(128) unsigned char smem[];
  flash::ForwardProgram<D>(CudaExec<E>{}, smem, qkv, out, lse, sh, blockIdx.x, blockIdx.y);
}
template <int D, typename E>
__global__ void __launch_bounds__(flash::kThreads)
    BackwardDqKernel(E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse,
                     float* dvec, flash::Shape sh) {
  extern __shared__ __align__(128) unsigned char smem[];
  flash::BackwardDqProgram<D>(CudaExec<E>{}, smem, dqkv, dout, qkv, out, lse, dvec, sh, blockIdx.x,
                              blockIdx.y);
}
template <int D, typename E>
__global__ void __launch_bounds__(flash::kThreads)
    BackwardDkvKernel(E* dqkv, const E* dout, const E* qkv, const float* lse, const float* dvec,
                      flash::Shape sh) {
  extern __shared__ __align__(128) unsigned char smem[];
  flash::BackwardDkvProgram<D>(CudaExec<E>{}, smem, dqkv, dout, qkv, lse, dvec, sh, blockIdx.x,
                               blockIdx.y);
}

// A kernel whose shared memory is over 48 KiB must say so before its first launch on a device:
// a driver call made once per kernel and device (the first 64 devices remembered), not per launch.
template <auto kKernel>
Status AllowSmem(int bytes) {
  static std::atomic<uint64_t> allowed{0};  // bit d: done on device d
  int device = 0;
  ZR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (allowed.load(std::memory_order_acquire) & bit) != 0) return absl::OkStatus();
  ZR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  allowed.fetch_or(bit, std::memory_order_acq_rel);
  return absl::OkStatus();
}

flash::Shape ShapeOf(const internal::FlashAttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, 1.0f / std::sqrt(static_cast<float>(s.head_size))};
}

template <int D, typename E>
Status Forward(const internal::FlashAttentionShape& shape, void* out, float* lse, const void* qkv,
               cudaStream_t stream) {
  const flash::Shape sh = ShapeOf(shape);
  constexpr int smem = flash::ForwardSmem<D>::bytes;
  ZR_RETURN_IF_ERROR((AllowSmem<ForwardKernel<D, E>>(smem)));
  ForwardKernel<D, E><<<dim3(sh.tiles(), sh.batch * sh.heads), flash::kThreads, smem, stream>>>(
      static_cast<const E*>(qkv), static_cast<E*>(out), lse, sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <int D, typename E>
Status Backward(const internal::FlashAttentionShape& shape, void* dqkv, float* dvec,
                const void* dout, const void* qkv, const void* out, const float* lse,
                cudaStream_t stream) {
  const flash::Shape sh = ShapeOf(shape);
  constexpr int smem = flash::BackwardSmem<D>::bytes;
  ZR_RETURN_IF_ERROR((AllowSmem<BackwardDqKernel<D, E>>(smem)));
  ZR_RETURN_IF_ERROR((AllowSmem<BackwardDkvKernel<D, E>>(smem)));
  BackwardDqKernel<D, E><<<dim3(sh.tiles(), sh.batch * sh.heads), flash::kThreads, smem, stream>>>(
      static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv),
      static_cast<const E*>(out), lse, dvec, sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  BackwardDkvKernel<D, E>
      <<<dim3(sh.tiles(), sh.batch * sh.kv_heads), flash::kThreads, smem, stream>>>(
          static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, dvec,
          sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Calls f<D, E>() for the shape's head size and the element type (checked first).
template <template <int, typename> class Fn, typename... Args>
Status Dispatch(DType dtype, const internal::FlashAttentionShape& shape, Args&&... args) {
  ZR_RETURN_IF_ERROR(internal::CheckFlashAttention(dtype, shape));
  const bool bf16 = dtype == DType::kBF16;
  if (shape.head_size == 64) {
    return bf16 ? Fn<64, __nv_bfloat16>::Run(args...) : Fn<64, __half>::Run(args...);
  }
  return bf16 ? Fn<128, __nv_bfloat16>::Run(args...) : Fn<128, __half>::Run(args...);
}
template <int D, typename E>
struct ForwardFn {
  template <typename... A>
  static Status Run(A&&... a) {
    return Forward<D, E>(a...);
  }
};
template <int D, typename E>
struct BackwardFn {
  template <typename... A>
  static Status Run(A&&... a) {
    return Backward<D, E>(a...);
  }
};

cudaStream_t Native(Stream& stream) { return static_cast<cudaStream_t>(stream.native_handle()); }

// The programs' 16-byte loads and stores need 16-byte aligned tensors.
Status CheckAligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError("flash attention on CUDA: a tensor is not 16-byte aligned");
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

Status CudaFlashAttentionForward(DType dtype, const FlashAttentionShape& shape, void* out,
                                 float* lse, const void* qkv, Stream& stream) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError("flash attention on CUDA needs a CUDA stream");
  }
  ZR_RETURN_IF_ERROR(CheckFlashAttention(dtype, shape));
  if (shape.batch == 0 || shape.seq == 0) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(CheckAligned({out, lse, qkv}));
  return Dispatch<ForwardFn>(dtype, shape, shape, out, lse, qkv, Native(stream));
}

Status CudaFlashAttentionBackward(DType dtype, const FlashAttentionShape& shape, void* dqkv,
                                  float* dvec, const void* dout, const void* qkv, const void* out,
                                  const float* lse, Stream& stream) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError("flash attention on CUDA needs a CUDA stream");
  }
  ZR_RETURN_IF_ERROR(CheckFlashAttention(dtype, shape));
  if (shape.batch == 0 || shape.seq == 0) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(CheckAligned({dqkv, dvec, dout, qkv, out, lse}));
  return Dispatch<BackwardFn>(dtype, shape, shape, dqkv, dvec, dout, qkv, out, lse, Native(stream));
}

}  // namespace internal
}  // namespace zerort
