// Tensor-parallel mappings and linears.
#include "zerort/layers/tp_layers.h"

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status Check(const TpContext& tp) {
  if (tp.kernels == nullptr || (tp.group.size() > 1 && tp.workspace == nullptr)) {
    return absl::InvalidArgumentError("tensor-parallel layer without kernels or workspace");
  }
  return absl::OkStatus();
}

Stream* On(const TpContext& tp) { return &tp.kernels->stream(); }

StatusOr<DType> Act(const TpContext& tp) {
  return CollectiveDType(tp.kernels->act_dtype(), "activations");
}

}  // namespace

Status CopyToRegionBackward(const TpContext& tp, void* grad, int64_t n) {
  ZR_RETURN_IF_ERROR(Check(tp));
  if (tp.group.size() == 1) return absl::OkStatus();
  ZR_ASSIGN_OR_RETURN(const DType act, Act(tp));
  return tp.group.comm->AllReduce(grad, grad, n, act, ReduceOp::kSum, On(tp));
}

Status ReduceFromRegionForward(const TpContext& tp, void* x, int64_t n) {
  return CopyToRegionBackward(tp, x, n);  // the same collective, in the other direction
}

Status GatherFromSequence(const TpContext& tp, const void* local, void* full, int64_t local_n) {
  ZR_RETURN_IF_ERROR(Check(tp));
  if (tp.group.size() == 1) {
    return CopyBytes(full, tp.kernels->device(), local, tp.kernels->device(),
                     local_n * tp.kernels->act_size(), On(tp));
  }
  ZR_ASSIGN_OR_RETURN(const DType act, Act(tp));
  return tp.group.comm->AllGather(local, full, local_n, act, On(tp));
}

Status ScatterToSequence(const TpContext& tp, const void* full, void* local, int64_t local_n) {
  ZR_RETURN_IF_ERROR(Check(tp));
  if (tp.group.size() == 1) {
    return CopyBytes(local, tp.kernels->device(), full, tp.kernels->device(),
                     local_n * tp.kernels->act_size(), On(tp));
  }
  ZR_ASSIGN_OR_RETURN(const DType act, Act(tp));
  return tp.group.comm->ReduceScatter(full, local, local_n, act, ReduceOp::kSum, On(tp));
}

Status ColumnParallelForward(const TpContext& tp, void* out_local, const void* x,
                             const void* w_local, const void* b_local, int64_t rows, int in,
                             int out_local_features) {
  ZR_RETURN_IF_ERROR(Check(tp));
  return tp.kernels->Matmul(out_local, x, w_local, b_local, rows, in, out_local_features);
}

Status ColumnParallelBackward(const TpContext& tp, void* dx, void* dw_local, void* db_local,
                              const void* dout_local, const void* x, const void* w_local,
                              int64_t rows, int in, int out_local_features) {
  ZR_RETURN_IF_ERROR(Check(tp));
  ModelKernels& k = *tp.kernels;
  if (tp.group.size() == 1 || dx == nullptr) {
    return k.MatmulBackward(dx, dw_local, db_local, dout_local, x, w_local, rows, in,
                            out_local_features);
  }
  // This layer's share of the input gradient alone is summed over the group: dx may already
  // hold other branches' gradients, which must not be multiplied by the group size.
  const int64_t n = rows * in;
  ZR_ASSIGN_OR_RETURN(Buffer partial,
                      tp.workspace->Allocate(n * k.act_size(), MemoryCategory::kWorkspace, On(tp)));
  ZR_RETURN_IF_ERROR(FillZero(partial.data(), k.device(), partial.bytes(), On(tp)));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(partial.data(), dw_local, db_local, dout_local, x, w_local,
                                      rows, in, out_local_features));
  ZR_RETURN_IF_ERROR(CopyToRegionBackward(tp, partial.data(), n));
  return k.Accumulate(dx, partial.data(), n);
}

Status RowParallelForward(const TpContext& tp, void* out, const void* x_local, const void* w_local,
                          const void* b, int64_t rows, int in_local, int out_features) {
  ZR_RETURN_IF_ERROR(Check(tp));
  ModelKernels& k = *tp.kernels;
  ZR_RETURN_IF_ERROR(k.Matmul(out, x_local, w_local, nullptr, rows, in_local, out_features));
  ZR_RETURN_IF_ERROR(ReduceFromRegionForward(tp, out, rows * out_features));
  return b == nullptr ? absl::OkStatus() : k.AddBias(out, b, rows, out_features);
}

Status RowParallelBackward(const TpContext& tp, void* dx_local, void* dw_local, void* db,
                           const void* dout, const void* x_local, const void* w_local, int64_t rows,
                           int in_local, int out_features) {
  ZR_RETURN_IF_ERROR(Check(tp));
  // [g]'s backward is the identity: dout is whole on every rank, so each computes the same db.
  return tp.kernels->MatmulBackward(dx_local, dw_local, db, dout, x_local, w_local, rows, in_local,
                                    out_features);
}

Status VocabParallelCrossEntropy(const TpContext& tp, void* logits_local, void* losses,
                                 const int32_t* targets, int64_t rows, int vocab_local,
                                 int valid_local, int vocab_begin, float dscale) {
  ZR_RETURN_IF_ERROR(Check(tp));
  ModelKernels& k = *tp.kernels;
  DType stat_dtype = DType::kF32;  // unused on one rank
  if (tp.group.size() > 1) {
    ZR_ASSIGN_OR_RETURN(stat_dtype, CollectiveDType(k.stat_dtype(), "statistics"));
  }
  if (valid_local < 0 || valid_local > vocab_local) {
    return absl::InvalidArgumentError(StrCat("valid columns ", valid_local, " of ", vocab_local));
  }
  const auto bytes = VocabParallelCrossEntropyScratch(rows, static_cast<int64_t>(k.stat_size()));
  Allocator& a = *tp.workspace;
  ZR_ASSIGN_OR_RETURN(
      Buffer max, a.Allocate(static_cast<size_t>(bytes[0]), MemoryCategory::kWorkspace, On(tp)));
  ZR_ASSIGN_OR_RETURN(
      Buffer sums, a.Allocate(static_cast<size_t>(bytes[1]), MemoryCategory::kWorkspace, On(tp)));
  ZR_RETURN_IF_ERROR(k.VocabMax(logits_local, max.data(), rows, vocab_local, valid_local));
  if (tp.group.size() > 1) {
    ZR_RETURN_IF_ERROR(
        tp.group.comm->AllReduce(max.data(), max.data(), rows, stat_dtype, ReduceOp::kMax, On(tp)));
  }
  ZR_RETURN_IF_ERROR(k.VocabSums(logits_local, max.data(), targets, sums.data(), rows, vocab_local,
                                 valid_local, vocab_begin));
  if (tp.group.size() > 1) {
    ZR_RETURN_IF_ERROR(tp.group.comm->AllReduce(sums.data(), sums.data(), 2 * rows, stat_dtype,
                                                ReduceOp::kSum, On(tp)));
  }
  return k.VocabCrossEntropyFinish(logits_local, losses, max.data(), sums.data(), targets, rows,
                                   vocab_local, valid_local, vocab_begin, dscale);
}

}  // namespace zerort
