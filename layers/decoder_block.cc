// The decoder's block layers: norm/linear transitions under tensor and sequence parallelism, a
// block's forward and backward, its activation set.
#include "zerort/layers/decoder_block.h"

#include "zerort/runtime/strings.h"

namespace zerort::decoder {

int LlamaSlot(const Geometry& g, LlamaParam p) {
  auto has = [&g](int q) {
    return q < kQB || (q <= kVB     ? g.f.qkv_bias
                       : q == kOB   ? g.f.o_proj_bias
                       : q < kQNorm ? g.f.mlp_bias
                                    : g.f.qk_norm);
  };
  if (!has(p)) return -1;
  int slot = 0;
  for (int q = 0; q < p; ++q) slot += has(q) ? 1 : 0;
  return slot;
}

namespace {
// The architecture's norm (LayerNorm, or RMSNorm: no mean, no bias) of `rows` rows.
Status Norm(const Ctx& c, void* out, void* mean, void* rstd, const void* x, const void* w,
            const void* b, int64_t rows) {
  if (!c.g.f.norm_has_bias()) return c.k.RmsNorm(out, rstd, x, w, rows, c.g.d, c.g.eps);
  return c.k.LayerNorm(out, mean, rstd, x, w, b, rows, c.g.d);
}
Status AddNorm(const Ctx& c, void* sum, void* out, void* mean, void* rstd, const void* residual,
               const void* w, const void* b, int64_t rows) {
  if (!c.g.f.norm_has_bias())
    return c.k.AddRmsNorm(sum, out, rstd, sum, residual, w, rows, c.g.d, c.g.eps);
  return c.k.AddLayerNorm(sum, out, mean, rstd, sum, residual, w, b, rows, c.g.d);
}
}  // namespace

Status NormToColumn(const Ctx& c, void* out, void* mean, void* rstd, const void* x, const void* w,
                    const void* b) {
  const Geometry& g = c.g;
  if (!g.sp) return Norm(c, out, mean, rstd, x, w, b, g.rows);
  ZR_RETURN_IF_ERROR(Norm(c, c.seq_local, mean, rstd, x, w, b, g.rows_l));
  return GatherFromSequence(c.tp, c.seq_local, out, g.rows_l * g.d);
}

Status AddNormToColumn(const Ctx& c, void* out, void* mean, void* rstd, void* x,
                       const void* residual, const void* w, const void* b) {
  const Geometry& g = c.g;
  if (!g.sp) return AddNorm(c, x, out, mean, rstd, residual, w, b, g.rows);
  ZR_RETURN_IF_ERROR(AddNorm(c, x, c.seq_local, mean, rstd, residual, w, b, g.rows_l));
  return GatherFromSequence(c.tp, c.seq_local, out, g.rows_l * g.d);
}

Status RowToResidual(const Ctx& c, void* out, const void* x_local, const void* w, const void* b,
                     int in_local) {
  const Geometry& g = c.g;
  if (g.t == 1) return c.k.Matmul(out, x_local, w, b, g.rows, in_local, g.d);
  if (!g.sp) return RowParallelForward(c.tp, out, x_local, w, b, g.rows, in_local, g.d);
  ZR_RETURN_IF_ERROR(c.k.Matmul(c.seq_full, x_local, w, nullptr, g.rows, in_local, g.d));
  ZR_RETURN_IF_ERROR(ScatterToSequence(c.tp, c.seq_full, out, g.rows_l * g.d));
  return b != nullptr ? c.k.AddBias(out, b, g.rows_l, g.d) : absl::OkStatus();
}

Status RowToResidualAdd(const Ctx& c, void* out, const void* x_local, const void* w, const void* b,
                        int in_local, const void* residual) {
  const Geometry& g = c.g;
  if (g.t == 1) return c.k.MatmulResidual(out, x_local, w, b, residual, g.rows, in_local, g.d);
  ZR_RETURN_IF_ERROR(RowToResidual(c, out, x_local, w, b, in_local));
  return c.k.Add(out, out, residual, g.rows_l * g.d);
}

Status BlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                    void* out) {
  const Geometry& g = c.g;
  if (g.f.qkv == QkvKind::kRotary) return LlamaBlockForward(c, w, x, a, out);
  ModelKernels& k = c.k;
  ZR_RETURN_IF_ERROR(
      NormToColumn(c, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w[kLn1W], w[kLn1B]));
  // Column-parallel QKV: this rank's heads (Q, K and V of each).
  ZR_RETURN_IF_ERROR(
      k.Matmul(a.qkv.data(), a.ln1.data(), w[kQkvW], w[kQkvB], g.rows, g.d, 3 * g.d_l));
  ZR_RETURN_IF_ERROR(
      k.Attention(a.atty.data(), a.att.data(), a.qkv.data(), g.batch, g.seq, g.d_l, g.h_l, g.h_l));
  ZR_RETURN_IF_ERROR(RowToResidual(c, a.res2.data(), a.atty.data(), w[kProjW], w[kProjB], g.d_l));
  // res2 += x, then ln2 = LayerNorm(res2): one pass (AddLayerNorm).
  ZR_RETURN_IF_ERROR(AddNormToColumn(c, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                                     a.res2.data(), x, w[kLn2W], w[kLn2B]));
  ZR_RETURN_IF_ERROR(k.MatmulGelu(a.mlp_in.data(), a.mlp_act.data(), a.ln2.data(), w[kFcW], w[kFcB],
                                  g.rows, g.d, g.f_l));
  return RowToResidualAdd(c, out, a.mlp_act.data(), w[kFcProjW], w[kFcProjB], g.f_l, a.res2.data());
}

StatusOr<const void*> ResidualGradOfEveryRow(const Ctx& c, BackwardScratch& s) {
  if (!c.g.sp) return static_cast<const void*>(s.dres.data());
  ZR_RETURN_IF_ERROR(GatherFromSequence(c.tp, s.dres.data(), s.dfull.data(), c.g.rows_l * c.g.d));
  return static_cast<const void*>(s.dfull.data());
}

StatusOr<const void*> ReduceColumnInputGrad(const Ctx& c, BackwardScratch& s) {
  const Geometry& g = c.g;
  if (g.sp) {
    ZR_RETURN_IF_ERROR(ScatterToSequence(c.tp, s.dbtc.data(), s.dloc.data(), g.rows_l * g.d));
    return static_cast<const void*>(s.dloc.data());
  }
  ZR_RETURN_IF_ERROR(CopyToRegionBackward(c.tp, s.dbtc.data(), g.rows * g.d));
  return static_cast<const void*>(s.dbtc.data());
}

Status NormBackward(const Ctx& c, BackwardScratch& s, int slot, const void* dout, const void* x,
                    const std::vector<void*>& w, const std::vector<void*>& grads, int weight,
                    const void* mean, const void* rstd) {
  const Geometry& g = c.g;
  void* dw = grads[weight];
  void* db = g.f.norm_has_bias() ? grads[weight + 1] : nullptr;
  if (g.sp) {
    auto* base = static_cast<std::byte*>(s.norm.data());
    dw = base + static_cast<size_t>(2 * slot) * g.d * c.k.grad_size();
    db = base + static_cast<size_t>(2 * slot + 1) * g.d * c.k.grad_size();
  }
  if (!g.f.norm_has_bias()) {
    return c.k.RmsNormBackward(s.dres.data(), dw, dout, x, w[weight], rstd, g.rows_l, g.d);
  }
  return c.k.LayerNormBackward(s.dres.data(), dw, db, dout, x, w[weight], mean, rstd, g.rows_l,
                               g.d);
}

Status ReduceNormGrads(const Ctx& c, BackwardScratch& s,
                       std::initializer_list<std::pair<void*, void*>> targets,
                       std::pair<void*, void*> qk_norms) {
  const Geometry& g = c.g;
  // [Note: per-head norms under tensor parallelism]: the q/k gains' parts follow the norms' in
  // s.norm, so one all-reduce sums both; without sequence parallelism only theirs.
  const bool rows = g.sp, heads = qk_norms.first != nullptr && QkNormGradsSummed(g);
  if (!rows && !heads) return absl::OkStatus();
  const int64_t norms_end = static_cast<int64_t>(targets.size()) * 2 * g.d;
  ZR_CHECK(!heads || norms_end <= QkNormGradOffset(g));
  const int64_t begin = rows ? 0 : QkNormGradOffset(g);
  const int64_t end = heads ? QkNormGradOffset(g) + 2 * int64_t{g.hs} : norms_end;
  const size_t gsize = c.k.grad_size();
  auto* base = static_cast<std::byte*>(s.norm.data());
  ZR_ASSIGN_OR_RETURN(const DType grad, CollectiveDType(c.k.grad_dtype(), "weight gradients"));
  ZR_RETURN_IF_ERROR(c.tp.group.comm->AllReduce(base + begin * gsize, base + begin * gsize,
                                                end - begin, grad, ReduceOp::kSum, &c.k.stream()));
  if (rows) {
    const size_t vec = static_cast<size_t>(g.d) * gsize;
    size_t i = 0;
    for (const auto& [dw, db] : targets) {
      ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(dw, base + (i++) * vec, g.d));
      if (db != nullptr) ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(db, base + i * vec, g.d));
      ++i;
    }
  }
  if (heads) {
    std::byte* parts = base + QkNormGradOffset(g) * gsize;
    ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(qk_norms.first, parts, g.hs));
    ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(qk_norms.second, parts + g.hs * gsize, g.hs));
  }
  return FillZero(base + begin * gsize, c.k.device(), static_cast<size_t>(end - begin) * gsize,
                  &c.k.stream());
}

Status BlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                     BackwardScratch& s) {
  const Geometry& g = c.g;
  if (g.f.qkv == QkvKind::kRotary) return LlamaBlockBackward(c, u, x, a, s);
  ModelKernels& k = c.k;
  const std::vector<void*>& w = u.params;
  const std::vector<void*>& gr = u.grads;
  // MLP: row-parallel projection, GELU, column-parallel fc.
  ZR_ASSIGN_OR_RETURN(const void* dout, ResidualGradOfEveryRow(c, s));
  // d(fc's output) = gelu'(pre) x (dout W_proj) into d4b, d4a its scratch (ModelKernels::
  // GeluMatmulBackward: one GEMM with cuBLASLt's DGELU epilogue on CUDA in 16 bits).
  ZR_RETURN_IF_ERROR(k.GeluMatmulBackward(s.d4b.data(), gr[kFcProjW], gr[kFcProjB], dout,
                                          a.mlp_act.data(), a.mlp_in.data(), w[kFcProjW],
                                          s.d4a.data(), g.rows, g.f_l, g.d));
  ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kFcW], gr[kFcB], s.d4b.data(),
                                           a.ln2.data(), w[kFcW], g.rows, g.d, g.f_l));
  ZR_ASSIGN_OR_RETURN(const void* dln2, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(NormBackward(c, s, 0, dln2, a.res2.data(), w, gr, kLn2W, a.ln2_mean.data(),
                                  a.ln2_rstd.data()));
  // Attention: row-parallel projection, this rank's heads, column-parallel QKV.
  ZR_ASSIGN_OR_RETURN(dout, ResidualGradOfEveryRow(c, s));
  ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kProjW], gr[kProjB], dout,
                                           a.atty.data(), w[kProjW], g.rows, g.d_l, g.d));
  ZR_RETURN_IF_ERROR(k.AttentionBackward(s.d4a.data(), s.dbtc.data(), a.qkv.data(), a.atty.data(),
                                         a.att.data(), g.batch, g.seq, g.d_l, g.h_l, g.h_l));
  ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kQkvW], gr[kQkvB], s.d4a.data(),
                                           a.ln1.data(), w[kQkvW], g.rows, g.d, 3 * g.d_l));
  ZR_ASSIGN_OR_RETURN(const void* dln1, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(
      NormBackward(c, s, 1, dln1, x, w, gr, kLn1W, a.ln1_mean.data(), a.ln1_rstd.data()));
  return ReduceNormGrads(c, s, {{gr[kLn2W], gr[kLn2B]}, {gr[kLn1W], gr[kLn1B]}});
}

Status AllocateBlockActs(const Geometry& g, ModelKernels& k, Allocator& activations, BlockActs& a) {
  const int64_t saved = k.AttentionSavedBytes(g.batch, g.seq, g.h_l, g.hs);
  for (const BlockActBuffer& b : BlockActPlan(g, static_cast<int64_t>(k.act_size()),
                                              static_cast<int64_t>(k.stat_size()), saved)) {
    ZR_ASSIGN_OR_RETURN(a.*b.member,
                        activations.Allocate(static_cast<size_t>(b.bytes),
                                             MemoryCategory::kActivations, &k.stream()));
  }
  return absl::OkStatus();
}

}  // namespace zerort::decoder
