// Megatron-LM's tensor-parallel building blocks over ModelKernels and a tensor-parallel group:
// the mappings (each a forward and its backward) and the column- and row-parallel linears. Every
// buffer is memory of the kernels' device, in act dtype; collectives run on the kernels' stream.
// Public (no CUDA/MPI includes): a trainer built on the installed package can split its own
// layers with them; the GPT model's blocks are built from them.
//
// Mappings (Megatron's names in brackets):
//   CopyToRegion     [f]: forward identity;                    backward: all-reduce (sum)
//   ReduceFromRegion [g]: forward all-reduce (sum);            backward identity
//   GatherFromSequence:   forward all-gather along the leading (sequence) dimension;
//                         backward reduce-scatter (sum) — ScatterToSequence's forward
//   ScatterToSequence:    forward reduce-scatter (sum);        backward all-gather
// The identity halves have no function. The activation layout that makes the sequence split
// contiguous is [seq, batch, hidden], as Megatron's.
//
// Column-parallel linear: weight [out/tp, in] (rank r holds rows r*out/tp ...), bias [out/tp];
// input x [rows, in] is whole on every rank; output [rows, out/tp]. Its backward all-reduces
// the input gradient ([f]'s backward).
// Row-parallel linear: weight [out, in/tp], input x_local [rows, in/tp]; the partial outputs are
// all-reduced ([g]) and the bias [out], whole on every rank, is added once, after the
// reduction; its gradient is the same on every rank (a replicated parameter).
#pragma once

#include <array>
#include <cstdint>

#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/tensor_parallel.h"
#include "zerort/runtime/allocator.h"

namespace zerort {

// The collectives' element types are the kernels' own (ModelKernels::act_dtype, stat_dtype):
// there is no second place to name them, so fp16 activations are never summed as bf16.
struct TpContext {
  TensorParallelGroup group;  // size 1: every function is the plain linear / a no-op
  ModelKernels* kernels = nullptr;
  Allocator* workspace = nullptr;  // scratch on the kernels' device (kWorkspace)
};

// [f]'s backward: grad (n elements) summed over the group, in place.
Status CopyToRegionBackward(const TpContext& tp, void* grad, int64_t n);
// [g]'s forward: x (n elements) summed over the group, in place.
Status ReduceFromRegionForward(const TpContext& tp, void* x, int64_t n);
// Sequence parallelism: `local` holds this rank's local_n elements (its rows); `full` tp x as many.
Status GatherFromSequence(const TpContext& tp, const void* local, void* full, int64_t local_n);
Status ScatterToSequence(const TpContext& tp, const void* full, void* local, int64_t local_n);

// out_local = x w_local^T + b_local.
Status ColumnParallelForward(const TpContext& tp, void* out_local, const void* x,
                             const void* w_local, const void* b_local, int64_t rows, int in,
                             int out_local_features);
// dx (+=) the whole input gradient, reduced over the group; dw_local, db_local (+=).
Status ColumnParallelBackward(const TpContext& tp, void* dx, void* dw_local, void* db_local,
                              const void* dout_local, const void* x, const void* w_local,
                              int64_t rows, int in, int out_local_features);
// out = allreduce(x_local w_local^T) + b (written, not added).
Status RowParallelForward(const TpContext& tp, void* out, const void* x_local, const void* w_local,
                          const void* b, int64_t rows, int in_local, int out_features);
// dx_local, dw_local (+=); db (+=) the bias gradient, identical on every rank.
Status RowParallelBackward(const TpContext& tp, void* dx_local, void* dw_local, void* db,
                           const void* dout, const void* x_local, const void* w_local, int64_t rows,
                           int in_local, int out_features);

// Vocabulary-parallel softmax cross-entropy (Megatron's): `logits_local` [rows, vocab_local] are
// this rank's columns [vocab_begin, vocab_begin + vocab_local) of logits whose full row never
// exists on one rank; the first `valid_local` are real vocabulary, the rest padding (a vocabulary
// the group size does not divide), which never reaches the loss. losses[rows] (stat dtype, the
// same on every rank) = -log softmax(row)[target]; with dscale non-zero the local logits become
// their gradient, (softmax - onehot) x dscale. Two all-reduces of per-row values: the max,
// then the sum of exponentials with the target logit, in the kernels' stat dtype (fp32; the
// double kernels' fp64 is refused).
Status VocabParallelCrossEntropy(const TpContext& tp, void* logits_local, void* losses,
                                 const int32_t* targets, int64_t rows, int vocab_local,
                                 int valid_local, int vocab_begin, float dscale);
// Its scratch (kWorkspace, freed when it returns), in allocation order: each row's max, then
// each row's sum of exponentials and target logit.
inline std::array<int64_t, 2> VocabParallelCrossEntropyScratch(int64_t rows, int64_t stat) {
  return {rows * stat, 2 * rows * stat};
}

}  // namespace zerort
