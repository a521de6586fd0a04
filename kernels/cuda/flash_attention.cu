// The CUDA executor of flash attention's block programs (kernels/flash_tiles.h,
// kernels/flash_forward.h, kernels/flash_backward.h): each thread runs the program's functions
// for its own index, and the warp instructions are PTX's (ldmatrix, mma.sync m16n8k16 with fp32
// accumulators, cp.async, xor shuffles) on the thread's registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "zerort/kernels/cuda/convert.cuh"
#include "zerort/kernels/cuda/exp2.cuh"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/flash_backward.h"
#include "zerort/kernels/flash_forward.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

template <typename E, int Warps = flash::kWarps>
struct CudaExec {
  using Elem = E;
  static constexpr int kWarps = Warps;
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
  // The warp instructions ([Note: flash attention's block programs]).
  template <typename T, int N>
  struct Regs {
    T v[N];
    __device__ T* at(int, int) { return v; }
    __device__ const T* at(int, int) const { return v; }
  };
  static constexpr bool kBf16 = std::is_same_v<E, __nv_bfloat16>;
  __device__ static float Exp2(float v) { return cuda::Ex2Approx(v); }
  // The paired conversion rounds a finite value as FromF does (to nearest, ties to even).
  __device__ static uint32_t Pack(float lo, float hi) {
    if constexpr (kBf16) {
      const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&p);
    } else {
      const __half2 p = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&p);
    }
  }
  template <int N, typename Addr>
  __device__ void LdMatrix(int, Regs<uint32_t, N>& r, int i, Addr addr) const {
    Ld<false>(r.v + i, addr(Lane()));
  }
  template <int N, typename Addr>
  __device__ void LdMatrixTrans(int, Regs<uint32_t, N>& r, int i, Addr addr) const {
    Ld<true>(r.v + i, addr(Lane()));
  }
  template <bool kTrans>
  __device__ static void Ld(uint32_t* d, const E* row) {
    const auto a = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (kTrans) {
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                   : "r"(a));
    } else {
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                   : "r"(a));
    }
  }
  template <int NC, int NA, int NB>
  __device__ void MmaSync(int, Regs<float, NC>& c, int i, const Regs<uint32_t, NA>& a, int j,
                          const Regs<uint32_t, NB>& b, int k) const {
    float* d = c.v + i;
    const uint32_t* x = a.v + j;
    const uint32_t* y = b.v + k;
    if constexpr (kBf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(y[0]), "r"(y[1]));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(y[0]), "r"(y[1]));
    }
  }
  template <typename T, int N, typename Op>
  __device__ void QuadAllReduce(int, Regs<T, N>& r, int i, Op op) const {
    T v = r.v[i];
    v = op(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = op(v, __shfl_xor_sync(0xffffffffu, v, 2));
    r.v[i] = v;
  }
  __device__ void CpAsync16(void* dst, const void* src, bool valid) const {
    const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
  }
  __device__ void AtomicAdd(float* p, float v) const { atomicAdd(p, v); }
  // p[0] += a, p[1] += b; p 8-byte aligned. sm_90 has a vector atomic (red.global.add.v2.f32).
  __device__ void AtomicAdd2(float* p, float a, float b) const {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
  }
  // Two elements (a packed pair, the lower one first) in one 32-bit store; p 4-byte aligned.
  __device__ void Store32(E* p, uint32_t v) const { *reinterpret_cast<uint32_t*>(p) = v; }
  // 16 bytes of global memory in one 128-bit access; p 16-byte aligned. The store is PTX's
  // st.global.v4: as a C++ store of the 16 bytes, ptxas split the dQ program's into four 32-bit
  // stores where its four packed pairs sat in registers that were not a quad.
  template <typename T>
  __device__ flash::Vec16<T> LoadGlobal16(const T* p) const {
    return *reinterpret_cast<const flash::Vec16<T>*>(p);
  }
  template <typename T>
  __device__ void StoreGlobal16(T* p, const flash::Vec16<T>& v) const {
    uint32_t u[4];
    memcpy(u, v.v, sizeof u);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(u[0]), "r"(u[1]),
                 "r"(u[2]), "r"(u[3])
                 : "memory");
  }
  // A float of shared memory written and read by one thread ([Note: the block programs' races]).
  __device__ void StoreShared(float* p, float v) const { *p = v; }
  __device__ float LoadShared(const float* p) const { return *p; }
  __device__ void CpAsyncCommit() const { asm volatile("cp.async.commit_group;\n" ::); }
  // The programs wait for all copies (0) or all but the newest group (1 or more).
  __device__ void CpAsyncWait(int in_flight) const {
    if (in_flight <= 0) {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    }
  }
  __device__ static int Lane() { return static_cast<int>(threadIdx.x) % 32; }
};

// G row groups a warp, W warps ([Note: the register-resident forward]).
template <int D, typename E, int G, int W>
__global__ void __launch_bounds__(32 * W)
    ForwardKernel(const E* qkv, E* out, float* lse, flash::Shape sh) {
  extern __shared__ __align__(128) unsigned char smem[];
  // Every head's last query tile (the most key tiles) first: [Note: the longest blocks first].
  const flash::GridBlock b = flash::LongestFirst(blockIdx.x, sh.batch * sh.heads);
  flash::ForwardProgram<D, G>(CudaExec<E, W>{}, smem, qkv, out, lse, sh,
                              flash::ForwardTiles<D, G, W>(sh) - 1 - b.rank, b.head);
}
// The backward's three programs ([Note: the backward's programs]).
template <int D, typename E>
__global__ void __launch_bounds__(flash::kThreads)
    BackwardDotKernel(const E* dout, const E* out, float* dvec, float* dq, flash::Shape sh) {
  flash::BackwardDotProgram<D>(CudaExec<E>{}, dout, out, dvec, dq, sh, blockIdx.x, blockIdx.y);
}
// W warps (4: 64-key blocks; 8: 128, kBackwardWarps' note). The 32-query chunk at head size 64
// with 4 warps exists for three blocks an SM (kBackwardChunk's note).
template <int D, typename E, int C, int W>
__global__ void __launch_bounds__(32 * W, D == 64 && C == 32 && W == 4 ? 3 : 1)
    BackwardKernel(E* dqkv, float* dq, const E* dout, const E* qkv, const float* lse,
                   const float* dvec, flash::Shape sh) {
  extern __shared__ __align__(128) unsigned char smem[];
  // A key tile's block visits the query tiles from the diagonal on: every head's tile 0 (the
  // most) first, [Note: the longest blocks first].
  const flash::GridBlock b = flash::LongestFirst(blockIdx.x, sh.batch * sh.kv_heads);
  flash::BackwardProgram<D, C>(CudaExec<E, W>{}, smem, dqkv, dq, dout, qkv, lse, dvec, sh, b.rank,
                               b.head);
}
template <int D, typename E>
__global__ void __launch_bounds__(flash::kThreads)
    BackwardStoreDqKernel(E* dqkv, const float* dq, flash::Shape sh) {
  flash::BackwardStoreDqProgram<D>(CudaExec<E>{}, dqkv, dq, sh, blockIdx.x, blockIdx.y);
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
  int limit = 0;  // the run's check (CheckAttentionBackend) says so first; this, for direct calls
  ZR_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > limit) {
    return absl::InvalidArgumentError(
        "flash attention: this block shape takes " + std::to_string(bytes) +
        " bytes of shared memory a block, more than the " + std::to_string(limit) +
        " CUDA device " + std::to_string(device) +
        " allows (FlashSharedBytesOf in kernels/flash_attention.h)");
  }
  ZR_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  allowed.fetch_or(bit, std::memory_order_acq_rel);
  return absl::OkStatus();
}

flash::Shape ShapeOf(const internal::FlashAttentionShape& s) {
  return {s.batch, s.seq, s.heads, s.kv_heads, 1.0f / std::sqrt(static_cast<float>(s.head_size))};
}

template <int D, typename E, int G, int W = flash::kWarps>
Status ForwardAs(const flash::Shape& sh, void* out, float* lse, const void* qkv,
                 cudaStream_t stream) {
  constexpr int smem = flash::ForwardSmem<D, G, W>::bytes;
  ZR_RETURN_IF_ERROR((AllowSmem<ForwardKernel<D, E, G, W>>(smem)));
  ForwardKernel<D, E, G, W>
      <<<flash::ForwardTiles<D, G, W>(sh) * sh.batch * sh.heads, 32 * W, smem, stream>>>(
          static_cast<const E*>(qkv), static_cast<E*>(out), lse, sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// `tiles.forward_block_queries` and `tiles.forward_warps` (CheckFlashTiles): 64 queries on 4
// warps (the default), 128 as two row groups on 4 (head size 64) or as one on 8 (ForwardBlockFor,
// [Note: the register-resident forward]).
template <int D, typename E>
Status Forward(const internal::FlashAttentionShape& shape, void* out, float* lse, const void* qkv,
               cudaStream_t stream, const FlashTiles& tiles) {
  const flash::Shape sh = ShapeOf(shape);
  const flash::ForwardBlock block =
      flash::ForwardBlockFor(D, tiles.forward_block_queries, tiles.forward_warps);
  if (block.warps == 8) return ForwardAs<D, E, 1, 8>(sh, out, lse, qkv, stream);
  if constexpr (D == 64) {
    if (block.groups == 2) return ForwardAs<D, E, 2>(sh, out, lse, qkv, stream);
  }
  return ForwardAs<D, E, 1>(sh, out, lse, qkv, stream);  // 64 queries on 4 warps
}

template <int D, typename E, int C, int W>
Status LaunchBackwardAs(const flash::Shape& sh, void* dqkv, float* dq, const void* dout,
                        const void* qkv, const float* lse, const float* dvec, cudaStream_t stream) {
  constexpr int keys = flash::kWarpRows * W;
  constexpr int smem = flash::BackwardSmem<D, keys>::bytes;
  ZR_RETURN_IF_ERROR((AllowSmem<BackwardKernel<D, E, C, W>>(smem)));
  BackwardKernel<D, E, C, W><<<sh.tiles(keys) * sh.batch * sh.kv_heads, 32 * W, smem, stream>>>(
      static_cast<E*>(dqkv), dq, static_cast<const E*>(dout), static_cast<const E*>(qkv), lse, dvec,
      sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The main program with W warps in chunks of `chunk` queries: 32 or 64 at head size 64, 32 at
// 128 (CheckFlashTiles).
template <int D, typename E, int W>
Status LaunchBackwardMain(int chunk, const flash::Shape& sh, void* dqkv, float* dq,
                          const void* dout, const void* qkv, const float* lse, const float* dvec,
                          cudaStream_t stream) {
  if constexpr (D == 64) {
    if (chunk == 64)
      return LaunchBackwardAs<D, E, 64, W>(sh, dqkv, dq, dout, qkv, lse, dvec, stream);
  }
  return LaunchBackwardAs<D, E, 32, W>(sh, dqkv, dq, dout, qkv, lse, dvec, stream);
}

// `tiles.backward_query_chunk`: 0 for the head size's default (kernels/flash_backward.h), else 32
// or 64; `tiles.backward_block_keys`: 0 for kBackwardWarps' default, or 64 or 128 (head size 64;
// CheckFlashTiles).
template <int D, typename E>
Status Backward(const internal::FlashAttentionShape& shape, void* dqkv, float* workspace,
                const void* dout, const void* qkv, const void* out, const float* lse,
                cudaStream_t stream, const FlashTiles& tiles) {
  const int query_chunk = tiles.backward_query_chunk, key_block = tiles.backward_block_keys;
  const flash::Shape sh = ShapeOf(shape);
  float* dvec = workspace;  // then the dQ accumulator: kernels/memory_facts.h's layout
  float* dq = workspace + FlashBackwardDqOffset(sh.batch, sh.heads, sh.seq);
  const dim3 queries(sh.tiles(), sh.batch * sh.heads);
  BackwardDotKernel<D, E><<<queries, flash::kThreads, 0, stream>>>(
      static_cast<const E*>(dout), static_cast<const E*>(out), dvec, dq, sh);
  ZR_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int chunk = query_chunk == 0 ? flash::kBackwardChunk<D> : query_chunk;
  if constexpr (D == 64) {
    ZR_RETURN_IF_ERROR(
        (flash::BackwardBlockKeys<D>(key_block) == 128
             ? LaunchBackwardMain<D, E, 8>(chunk, sh, dqkv, dq, dout, qkv, lse, dvec, stream)
             : LaunchBackwardMain<D, E, 4>(chunk, sh, dqkv, dq, dout, qkv, lse, dvec, stream)));
  } else {
    static_assert(D == 64 || flash::kBackwardWarps<D> == flash::kWarps,
                  "128-key blocks are built at head size 64 only");
    ZR_RETURN_IF_ERROR((LaunchBackwardMain<D, E, flash::kWarps>(chunk, sh, dqkv, dq, dout, qkv, lse,
                                                                dvec, stream)));
  }
  BackwardStoreDqKernel<D, E>
      <<<queries, flash::kThreads, 0, stream>>>(static_cast<E*>(dqkv), dq, sh);
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

// The flash kernels' block shapes, checked (CheckFlashTiles) with the error's origin named.
Status CheckTiles(const FlashTiles& tiles, int head_size) {
  const Status s = internal::CheckFlashTiles(tiles, head_size);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(std::string("flash attention on CUDA: ") +
                                    std::string(s.message()));
}

}  // namespace

namespace internal {

Status CudaFlashAttentionForward(DType dtype, const FlashAttentionShape& shape, void* out,
                                 float* lse, const void* qkv, Stream& stream,
                                 const FlashTiles& tiles) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError("flash attention on CUDA needs a CUDA stream");
  }
  ZR_RETURN_IF_ERROR(CheckFlashAttention(dtype, shape));
  ZR_RETURN_IF_ERROR(CheckTiles(tiles, shape.head_size));
  if (shape.batch == 0 || shape.seq == 0) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(CheckAligned({out, lse, qkv}));
  return Dispatch<ForwardFn>(dtype, shape, shape, out, lse, qkv, Native(stream), tiles);
}

Status CudaFlashAttentionBackward(DType dtype, const FlashAttentionShape& shape, void* dqkv,
                                  float* workspace, const void* dout, const void* qkv,
                                  const void* out, const float* lse, Stream& stream,
                                  const FlashTiles& tiles) {
  if (!stream.device().is_cuda()) {
    return absl::InvalidArgumentError("flash attention on CUDA needs a CUDA stream");
  }
  ZR_RETURN_IF_ERROR(CheckFlashAttention(dtype, shape));
  ZR_RETURN_IF_ERROR(CheckTiles(tiles, shape.head_size));
  if (shape.batch == 0 || shape.seq == 0) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(CheckAligned({dqkv, workspace, dout, qkv, out, lse}));
  return Dispatch<BackwardFn>(dtype, shape, shape, dqkv, workspace, dout, qkv, out, lse,
                              Native(stream), tiles);
}

}  // namespace internal
}  // namespace zerort
