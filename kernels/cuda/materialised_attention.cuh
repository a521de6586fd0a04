// The materialised attention program on CUDA (internal to kernels/cuda/, included by
// model_kernels.cu): what the model's attention runs where zerort's flash kernels do not apply
// (fp32, head sizes other than 64 and 128) or where a run asks for it
// (model.attention_backend; kernels/memory_facts.h's AttentionProgramFor chooses). Q, K and V
// split into [batch, heads, seq, head size], the scores by strided-batched cuBLAS GEMMs (the
// classic cuBLAS handle this program owns; the linear layers' GEMMs are cuBLASLt's), a causal
// softmax kernel between them, the probabilities saved for the backward; scratch as
// kernels/memory_facts.h's AttentionScratchBytes lays it out, so the estimator follows.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "zerort/kernels/cuda/launch_context.cuh"
#include "zerort/kernels/cuda/model_ops.cuh"
#include "zerort/kernels/gemm_map.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/runtime/internal/cublas_api.h"
#include "zerort/runtime/internal/cuda_check.h"

namespace zerort {
namespace {

// ---- the kernels -----------------------------------------------------------------------------

using math::TokenMajorIndex;  // kernels/model_math.h

// qkv [B, T, (NH + 2 KV) HS] ([Note: the qkv layout]) -> q, k, v [B, NH, T, HS]: each query head
// with its group's key/value head beside it (the batched GEMMs want one per query head).
template <typename T>
static __global__ void SplitHeadsKernel(T* q, T* k, T* v, const T* qkv, int batch, int seq,
                                        math::QkvLayout l) {
  const int hs = l.hs;
  const int64_t n = int64_t{batch} * l.heads * seq * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(i % hs);
    const int64_t bt = i / (int64_t{hs} * seq * l.heads) * seq + (i / hs) % seq;  // b seq + t
    const int h = static_cast<int>((i / (int64_t{hs} * seq)) % l.heads);
    const T* row = qkv + bt * l.row() + d;
    q[i] = row[l.q(h)];
    k[i] = row[l.k(h)];
    v[i] = row[l.v(h)];
  }
}

// dqkv [B, T, (NH + 2 KV) HS] = dq, and dk, dv [B, NH, T, HS] summed over each key/value head's
// query heads (in order, by the thread of the group's first query head: no atomics); every
// element of dqkv written.
template <typename T>
static __global__ void MergeHeadGradsKernel(T* dqkv, const T* dq, const T* dk, const T* dv,
                                            int batch, int seq, math::QkvLayout l) {
  const int hs = l.hs, group = l.group();
  const int64_t n = int64_t{batch} * l.heads * seq * hs, head_stride = int64_t{seq} * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(i % hs);
    const int64_t bt = i / (int64_t{hs} * seq * l.heads) * seq + (i / hs) % seq;
    const int h = static_cast<int>((i / head_stride) % l.heads);
    T* row = dqkv + bt * l.row() + d;
    row[l.q(h)] = dq[i];
    if (h % group != 0) continue;
    float sk = 0.0f, sv = 0.0f;
    for (int g = 0; g < group; ++g) {
      sk += ToFloat(dk[i + g * head_stride]);
      sv += ToFloat(dv[i + g * head_stride]);
    }
    row[l.k(h)] = FromFloat<T>(sk);
    row[l.v(h)] = FromFloat<T>(sv);
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

// The softmax kernels' warp per score row: the row (b, h, t flattened), the thread's lane and the
// row's query position t (the keys 0 .. t it sees).
struct ScoreRow {
  int64_t row;
  int lane, t;
};
__device__ __forceinline__ ScoreRow ScoreRowOf(int seq) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  return {row, static_cast<int>(threadIdx.x & 31), static_cast<int>(row % seq)};
}

// att[row, :] = causal softmax(preatt[row, :]); row = (b, h, t); one warp per row. The scores
// come already scaled by 1 / sqrt(head size) (the GEMM's alpha), so they are stored, in the
// activation dtype, at the magnitude the softmax sees.
template <typename T>
static __global__ void CausalSoftmaxKernel(T* att, const T* preatt, int64_t rows, int seq) {
  const auto [row, lane, t] = ScoreRowOf(seq);
  if (row >= rows) return;
  const T* x = preatt + row * seq;
  T* y = att + row * seq;
  float max = -INFINITY;
  for (int j = lane; j <= t; j += 32) max = fmaxf(max, ToFloat(x[j]));
  max = WarpMax(max);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += 32) sum += math::FastExp(math::Sub(ToFloat(x[j]), max));
  sum = WarpSum(sum);
  for (int j = lane; j < seq; j += 32) {
    y[j] =
        FromFloat<T>(j <= t ? math::Div(math::FastExp(math::Sub(ToFloat(x[j]), max)), sum) : 0.0f);
  }
}

// dscore = att * (datt - sum(att * datt)) for the causal part, 0 above the diagonal; in place.
template <typename T>
static __global__ void CausalSoftmaxBackwardKernel(T* datt, const T* att, int64_t rows, int seq) {
  const auto [row, lane, t] = ScoreRowOf(seq);
  if (row >= rows) return;
  T* d = datt + row * seq;
  const T* a = att + row * seq;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += ToFloat(a[j]) * ToFloat(d[j]);
  dot = WarpSum(dot);
  for (int j = lane; j < seq; j += 32) {
    d[j] = FromFloat<T>(j <= t ? ToFloat(a[j]) * (ToFloat(d[j]) - dot) : 0.0f);
  }
}

// ---- the program -----------------------------------------------------------------------------

struct BlasDeleter {
  decltype(&cublasDestroy_v2) destroy;
  void operator()(cublasContext* h) const { destroy(h); }
};

template <typename T>
class MaterialisedAttention {
 public:
  MaterialisedAttention(const internal::CublasApi& blas, const LaunchContext& ctx)
      : b_(blas), ctx_(ctx), handle_(nullptr, BlasDeleter{blas.Destroy}) {}

  // The cuBLAS handle, on the kernels' stream; fp32 stays fp32 (no TF32: the CPU twin is the
  // reference).
  Status Init() {
    cublasHandle_t blas = nullptr;
    ZR_CUBLAS_RETURN_IF_ERROR(b_.Create(&blas));
    handle_.reset(blas);
    ZR_CUBLAS_RETURN_IF_ERROR(b_.SetStream(blas, ctx_.s()));
    ZR_CUBLAS_RETURN_IF_ERROR(b_.SetMathMode(blas, CUBLAS_DEFAULT_MATH));
    return absl::OkStatus();
  }

  // ModelKernels::Attention: out, and the probabilities into `att`.
  Status Forward(void* out, void* att, const void* qkv, int batch, int seq, int channels, int heads,
                 int kv_heads) {
    const int hs = channels / heads;
    const math::QkvLayout l{heads, kv_heads, hs};
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t bh = int64_t{batch} * heads;
    // q, k, v, the scores: kernels/memory_facts.h's AttentionScratchBytes.
    const std::vector<int64_t> bytes =
        AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kMaterialised, false, batch,
                              seq, channels, heads, kv_heads, sizeof(T));
    ZR_ASSIGN_OR_RETURN(Heads heads_qkv, SplitHeads(qkv, batch, seq, l, bytes));
    Buffer &q = heads_qkv.q, &k = heads_qkv.k, &v = heads_qkv.v;
    ZR_ASSIGN_OR_RETURN(Buffer preatt, ctx_.Scratch(bytes[3]));
    // preatt[b,h] [T, T] = scale q [T, HS] x k^T: the scale is the GEMM's alpha, applied to the
    // fp32 accumulator, so the scores are stored (in the activation dtype) at the magnitude the
    // softmax sees rather than sqrt(head size) times larger (fp16's range, bf16's precision).
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    ZR_RETURN_IF_ERROR(BatchedGemm(false, true, seq, seq, hs, scale, q.data(), hs,
                                   int64_t{seq} * hs, k.data(), hs, int64_t{seq} * hs, 0.0f,
                                   preatt.data(), seq, int64_t{seq} * seq, bh));
    CausalSoftmaxKernel<T><<<RowBlocks(bh * seq), kThreads, 0, ctx_.s()>>>(
        static_cast<T*>(att), preatt.as<T>(), bh * seq, seq);
    ZR_RETURN_IF_ERROR(ctx_.Launched("CausalSoftmax"));
    // y [T, HS] = att [T, T] x v [T, HS]; y reuses q's memory.
    ZR_RETURN_IF_ERROR(BatchedGemm(false, false, seq, hs, seq, 1.0f, att, seq, int64_t{seq} * seq,
                                   v.data(), hs, int64_t{seq} * hs, 0.0f, q.data(), hs,
                                   int64_t{seq} * hs, bh));
    HeadsLayoutKernel<T><<<Blocks(n), kThreads, 0, ctx_.s()>>>(static_cast<T*>(out), q.as<T>(),
                                                               batch, seq, heads, hs, true);
    return ctx_.Launched("HeadsLayout");
  }

  // ModelKernels::AttentionBackward from the saved probabilities: dqkv written.
  Status Backward(void* dqkv, const void* dout, const void* qkv, const void* att, int batch,
                  int seq, int channels, int heads, int kv_heads) {
    const int hs = channels / heads;
    const math::QkvLayout l{heads, kv_heads, hs};
    const int64_t n = int64_t{batch} * seq * channels;
    const int64_t bh = int64_t{batch} * heads;
    const int64_t ths = int64_t{seq} * hs, tt = int64_t{seq} * seq;
    // q, k, v, dy, the scores' gradient, dk: kernels/memory_facts.h's AttentionScratchBytes.
    const std::vector<int64_t> bytes =
        AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kMaterialised, true, batch,
                              seq, channels, heads, kv_heads, sizeof(T));
    ZR_ASSIGN_OR_RETURN(Heads heads_qkv, SplitHeads(qkv, batch, seq, l, bytes));
    Buffer &q = heads_qkv.q, &k = heads_qkv.k, &v = heads_qkv.v;
    ZR_ASSIGN_OR_RETURN(Buffer dy, ctx_.Scratch(bytes[3]));
    ZR_ASSIGN_OR_RETURN(Buffer datt, ctx_.Scratch(bytes[4]));
    HeadsLayoutKernel<T><<<Blocks(n), kThreads, 0, ctx_.s()>>>(
        dy.as<T>(), static_cast<const T*>(dout), batch, seq, heads, hs, false);
    ZR_RETURN_IF_ERROR(ctx_.Launched("HeadsLayout"));
    // datt [T, T] = dy [T, HS] x v^T
    ZR_RETURN_IF_ERROR(BatchedGemm(false, true, seq, seq, hs, 1.0f, dy.data(), hs, ths, v.data(),
                                   hs, ths, 0.0f, datt.data(), seq, tt, bh));
    // dv [T, HS] = att^T [T, T] x dy (written over v, which is no longer needed)
    ZR_RETURN_IF_ERROR(BatchedGemm(true, false, seq, hs, seq, 1.0f, att, seq, tt, dy.data(), hs,
                                   ths, 0.0f, v.data(), hs, ths, bh));
    CausalSoftmaxBackwardKernel<T><<<RowBlocks(bh * seq), kThreads, 0, ctx_.s()>>>(
        datt.as<T>(), static_cast<const T*>(att), bh * seq, seq);
    ZR_RETURN_IF_ERROR(ctx_.Launched("CausalSoftmaxBackward"));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // dq [T, HS] = scale dscore [T, T] x k (into dy); dk = scale dscore^T x q (into k... after q
    // is read: dk goes to a fresh buffer).
    ZR_ASSIGN_OR_RETURN(Buffer dk, ctx_.Scratch(bytes[5]));
    ZR_RETURN_IF_ERROR(BatchedGemm(false, false, seq, hs, seq, scale, datt.data(), seq, tt,
                                   k.data(), hs, ths, 0.0f, dy.data(), hs, ths, bh));
    ZR_RETURN_IF_ERROR(BatchedGemm(true, false, seq, hs, seq, scale, datt.data(), seq, tt, q.data(),
                                   hs, ths, 0.0f, dk.data(), hs, ths, bh));
    MergeHeadGradsKernel<T><<<Blocks(n), kThreads, 0, ctx_.s()>>>(
        static_cast<T*>(dqkv), dy.as<T>(), dk.as<T>(), v.as<T>(), batch, seq, l);
    return ctx_.Launched("MergeHeadGrads");
  }

 private:
  struct Heads {
    Buffer q, k, v;
  };
  // q, k and v ([batch, heads, seq, head size] each) split from qkv into the first three of
  // AttentionScratchBytes' buffers (`bytes`), allocated in its order, both directions' first step.
  StatusOr<Heads> SplitHeads(const void* qkv, int batch, int seq, const math::QkvLayout& l,
                             const std::vector<int64_t>& bytes) {
    ZR_ASSIGN_OR_RETURN(Buffer q, ctx_.Scratch(bytes[0]));
    ZR_ASSIGN_OR_RETURN(Buffer k, ctx_.Scratch(bytes[1]));
    ZR_ASSIGN_OR_RETURN(Buffer v, ctx_.Scratch(bytes[2]));
    const int64_t n = int64_t{batch} * l.heads * seq * l.hs;
    SplitHeadsKernel<T><<<Blocks(n), kThreads, 0, ctx_.s()>>>(
        q.as<T>(), k.as<T>(), v.as<T>(), static_cast<const T*>(qkv), batch, seq, l);
    ZR_RETURN_IF_ERROR(ctx_.Launched("SplitHeads"));
    return Heads{std::move(q), std::move(k), std::move(v)};
  }

  // Row-major, batched: C[i] [M, N] = alpha op(A[i]) [M, K] x op(B[i]) [K, N] + beta C[i], with
  // leading dimensions of the stored (row-major) matrices, computed as gemm::RowMajor's
  // column-major C^T = op(B)^T op(A)^T.
  Status BatchedGemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                     int lda, int64_t stride_a, const void* b, int ldb, int64_t stride_b,
                     float beta, void* c, int ldc, int64_t stride_c, int64_t batch) {
    const gemm::ColumnMajor g = gemm::RowMajor(trans_a, trans_b, m, n, k, lda, ldb, ldc);
    ZR_CUBLAS_RETURN_IF_ERROR(b_.GemmStridedBatchedEx(
        handle_.get(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, b,
        CudaType<T>(), static_cast<int>(g.lda), stride_b, a, CudaType<T>(), static_cast<int>(g.ldb),
        stride_a, &beta, c, CudaType<T>(), static_cast<int>(g.ldd), stride_c,
        static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    ++ctx_.launches["cuBLAS batched GEMM"];
    return absl::OkStatus();
  }

  const internal::CublasApi& b_;
  LaunchContext ctx_;
  std::unique_ptr<cublasContext, BlasDeleter> handle_;
};

}  // namespace
}  // namespace zerort
