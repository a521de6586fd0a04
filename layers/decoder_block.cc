// The decoder's block layers: norm/linear transitions under tensor and sequence parallelism, a
// block's forward and backward, its activation set.
#include "zerort/layers/decoder_block.h"

#include "zerort/runtime/strings.h"

namespace zerort::decoder {

Geometry MakeGeometry(const DecoderModelOptions& o, int batch, int seq) {
  return MakeGeometry(o.config, o.tp.size(), o.tp.rank(), o.sequence_parallel, o.vocab_multiple,
                      batch, seq);
}

Geometry MakeGeometry(const DecoderConfig& c, int tp_size, int tp_rank, bool sequence_parallel,
                      int vocab_multiple, int batch, int seq) {
  Geometry g;
  g.t = tp_size;
  g.r = tp_rank;
  g.batch = batch;
  g.seq = seq;
  g.rows = static_cast<int64_t>(batch) * seq;
  // Any contiguous split of the rows works: every op in the sequence-parallel region (LayerNorm,
  // residual additions) is per row. A pass whose rows do not divide (a short prompt) runs
  // without it, which computes the same values.
  g.sp = sequence_parallel && g.t > 1 && g.rows % g.t == 0;
  g.rows_l = g.sp ? g.rows / g.t : g.rows;
  g.d = c.d_model;
  g.d_l = c.d_model / g.t;
  g.h_l = c.n_head / g.t;
  g.f_l = c.ffn_channels() / g.t;
  g.llama = c.llama();
  g.hs = c.head_size();
  g.kv_l = c.kv_heads() / g.t;
  g.eps = static_cast<float>(c.norm_eps);
  g.rope = Rope{.theta = c.rope_theta, .scaling = c.rope_scaling};
  g.qkv_bias = c.qkv_bias;
  g.o_proj_bias = c.o_proj_bias;
  g.mlp_bias = c.mlp_bias;
  g.v_l = static_cast<int>(PaddedVocab(c, g.t, vocab_multiple) / g.t);
  g.v_begin = g.r * g.v_l;
  g.v_valid = std::clamp(c.vocab_size - g.v_begin, 0, g.v_l);
  return g;
}

int LlamaSlot(const Geometry& g, LlamaParam p) {
  auto has = [&g](int q) {
    return q < kQB || (q <= kVB ? g.qkv_bias : q == kOB ? g.o_proj_bias : g.mlp_bias);
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
  if (c.g.llama) return c.k.RmsNorm(out, rstd, x, w, rows, c.g.d, c.g.eps);
  return c.k.LayerNorm(out, mean, rstd, x, w, b, rows, c.g.d);
}
Status AddNorm(const Ctx& c, void* sum, void* out, void* mean, void* rstd, const void* residual,
               const void* w, const void* b, int64_t rows) {
  if (c.g.llama) return c.k.AddRmsNorm(sum, out, rstd, sum, residual, w, rows, c.g.d, c.g.eps);
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

Status BlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                    void* out) {
  const Geometry& g = c.g;
  if (g.llama) return LlamaBlockForward(c, w, x, a, out);
  ModelKernels& k = c.k;
  ZR_RETURN_IF_ERROR(
      NormToColumn(c, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w[kLn1W], w[kLn1B]));
  // Column-parallel QKV: this rank's heads (Q, K and V of each).
  ZR_RETURN_IF_ERROR(
      k.Matmul(a.qkv.data(), a.ln1.data(), w[kQkvW], w[kQkvB], g.rows, g.d, 3 * g.d_l));
  ZR_RETURN_IF_ERROR(
      k.Attention(a.atty.data(), a.att.data(), a.qkv.data(), g.batch, g.seq, g.d_l, g.h_l));
  ZR_RETURN_IF_ERROR(RowToResidual(c, a.res2.data(), a.atty.data(), w[kProjW], w[kProjB], g.d_l));
  // res2 += x, then ln2 = LayerNorm(res2): one pass (AddLayerNorm).
  ZR_RETURN_IF_ERROR(AddNormToColumn(c, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                                     a.res2.data(), x, w[kLn2W], w[kLn2B]));
  ZR_RETURN_IF_ERROR(k.MatmulGelu(a.mlp_in.data(), a.mlp_act.data(), a.ln2.data(), w[kFcW], w[kFcB],
                                  g.rows, g.d, g.f_l));
  ZR_RETURN_IF_ERROR(RowToResidual(c, out, a.mlp_act.data(), w[kFcProjW], w[kFcProjB], g.f_l));
  return k.Add(out, out, a.res2.data(), g.rows_l * g.d);
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
  void* db = g.llama ? nullptr : grads[weight + 1];  // RMSNorm has no bias
  if (g.sp) {
    auto* base = static_cast<std::byte*>(s.norm.data());
    dw = base + static_cast<size_t>(2 * slot) * g.d * c.k.grad_size();
    db = base + static_cast<size_t>(2 * slot + 1) * g.d * c.k.grad_size();
  }
  if (g.llama) {
    return c.k.RmsNormBackward(s.dres.data(), dw, dout, x, w[weight], rstd, g.rows_l, g.d);
  }
  return c.k.LayerNormBackward(s.dres.data(), dw, db, dout, x, w[weight], mean, rstd, g.rows_l,
                               g.d);
}

Status ReduceNormGrads(const Ctx& c, BackwardScratch& s,
                       std::initializer_list<std::pair<void*, void*>> targets) {
  const Geometry& g = c.g;
  if (!g.sp) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(targets.size()) * 2 * g.d;
  ZR_ASSIGN_OR_RETURN(const DType grad, CollectiveDType(c.k.grad_dtype(), "weight gradients"));
  ZR_RETURN_IF_ERROR(c.tp.group.comm->AllReduce(s.norm.data(), s.norm.data(), n, grad,
                                                ReduceOp::kSum, &c.k.stream()));
  auto* base = static_cast<std::byte*>(s.norm.data());
  const size_t vec = static_cast<size_t>(g.d) * c.k.grad_size();
  size_t i = 0;
  for (const auto& [dw, db] : targets) {
    ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(dw, base + (i++) * vec, g.d));
    if (db != nullptr) ZR_RETURN_IF_ERROR(c.k.AccumulateGrad(db, base + i * vec, g.d));
    ++i;
  }
  return FillZero(s.norm.data(), c.k.device(), s.norm.bytes(), &c.k.stream());
}

Status BlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                     BackwardScratch& s) {
  const Geometry& g = c.g;
  if (g.llama) return LlamaBlockBackward(c, u, x, a, s);
  ModelKernels& k = c.k;
  const Device dev = k.device();
  Stream* st = &k.stream();
  const std::vector<void*>& w = u.params;
  const std::vector<void*>& gr = u.grads;
  const size_t act = k.act_size();
  // MLP: row-parallel projection, GELU, column-parallel fc.
  ZR_ASSIGN_OR_RETURN(const void* dout, ResidualGradOfEveryRow(c, s));
  ZR_RETURN_IF_ERROR(FillZero(s.d4a.data(), dev, g.rows * g.f_l * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.d4a.data(), gr[kFcProjW], gr[kFcProjB], dout,
                                      a.mlp_act.data(), w[kFcProjW], g.rows, g.f_l, g.d));
  ZR_RETURN_IF_ERROR(FillZero(s.d4b.data(), dev, g.rows * g.f_l * act, st));
  ZR_RETURN_IF_ERROR(k.GeluBackward(s.d4b.data(), a.mlp_in.data(), s.d4a.data(), g.rows * g.f_l));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, g.rows * g.d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kFcW], gr[kFcB], s.d4b.data(), a.ln2.data(),
                                      w[kFcW], g.rows, g.d, g.f_l));
  ZR_ASSIGN_OR_RETURN(const void* dln2, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(NormBackward(c, s, 0, dln2, a.res2.data(), w, gr, kLn2W, a.ln2_mean.data(),
                                  a.ln2_rstd.data()));
  // Attention: row-parallel projection, this rank's heads, column-parallel QKV.
  ZR_ASSIGN_OR_RETURN(dout, ResidualGradOfEveryRow(c, s));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, g.rows * g.d_l * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kProjW], gr[kProjB], dout, a.atty.data(),
                                      w[kProjW], g.rows, g.d_l, g.d));
  ZR_RETURN_IF_ERROR(FillZero(s.d4a.data(), dev, g.rows * 3 * g.d_l * act, st));
  ZR_RETURN_IF_ERROR(k.AttentionBackward(s.d4a.data(), s.dbtc.data(), a.qkv.data(), a.atty.data(),
                                         a.att.data(), g.batch, g.seq, g.d_l, g.h_l));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, g.rows * g.d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kQkvW], gr[kQkvB], s.d4a.data(),
                                      a.ln1.data(), w[kQkvW], g.rows, g.d, 3 * g.d_l));
  ZR_ASSIGN_OR_RETURN(const void* dln1, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(
      NormBackward(c, s, 1, dln1, x, w, gr, kLn1W, a.ln1_mean.data(), a.ln1_rstd.data()));
  return ReduceNormGrads(c, s, {{gr[kLn2W], gr[kLn2B]}, {gr[kLn1W], gr[kLn1B]}});
}

std::vector<ScratchBuffer> BackwardScratchPlan(const Geometry& g, int64_t act, int64_t grad,
                                               bool head_gave_dbtc) {
  std::vector<ScratchBuffer> plan = {{&BackwardScratch::dres, g.rows_l * g.d * act}};
  if (!head_gave_dbtc) plan.push_back({&BackwardScratch::dbtc, g.rows * g.d * act});
  if (g.sp) {
    plan.push_back({&BackwardScratch::dfull, g.rows * g.d * act});
    plan.push_back({&BackwardScratch::dloc, g.rows_l * g.d * act});
    plan.push_back({&BackwardScratch::norm, 4 * g.d * grad});
  }
  return plan;
}

std::vector<ScratchBuffer> BlockBackwardScratchPlan(const Geometry& g, int64_t act) {
  if (g.llama) {
    const int64_t projections = int64_t{g.h_l + 2 * g.kv_l} * g.hs;
    return {{&BackwardScratch::d4a, g.rows * std::max<int64_t>(g.f_l, 3 * g.d_l) * act},
            {&BackwardScratch::d4b, g.rows * std::max<int64_t>(2 * g.f_l, projections) * act}};
  }
  return {{&BackwardScratch::d4a, g.rows * g.f_l * act},
          {&BackwardScratch::d4b, g.rows * g.f_l * act}};
}

int64_t ProjectionScratchBytes(const Geometry& g, int64_t act) {
  return g.llama ? g.rows * (g.h_l + 2 * g.kv_l) * g.hs * act : 0;
}

std::vector<BlockActBuffer> BlockActPlan(const Geometry& g, int64_t act, int64_t stat,
                                         int64_t attention_saved) {
  const int64_t rows = g.rows, rows_l = g.rows_l, d = g.d;
  if (g.llama) {
    return {{&BlockActs::ln1, rows * d * act},
            {&BlockActs::ln1_rstd, rows_l * stat},
            {&BlockActs::qkv, rows * 3 * g.d_l * act},  // after the rotation, heads repeated
            {&BlockActs::atty, rows * g.d_l * act},
            {&BlockActs::att, attention_saved},
            {&BlockActs::res2, rows_l * d * act},
            {&BlockActs::ln2, rows * d * act},
            {&BlockActs::ln2_rstd, rows_l * stat},
            {&BlockActs::mlp_in, rows * g.f_l * act},  // gate
            {&BlockActs::mlp_up, rows * g.f_l * act},
            {&BlockActs::mlp_act, rows * g.f_l * act}};  // SwiGLU's output
  }
  return {{&BlockActs::ln1, rows * d * act},  // every row: the input of column layers
          {&BlockActs::ln1_mean, rows_l * stat},
          {&BlockActs::ln1_rstd, rows_l * stat},
          {&BlockActs::qkv, rows * 3 * g.d_l * act},
          {&BlockActs::atty, rows * g.d_l * act},
          // What the kernels' attention keeps for its backward (the CPU: a log-sum-exp per query).
          {&BlockActs::att, attention_saved},
          {&BlockActs::res2, rows_l * d * act},
          {&BlockActs::ln2, rows * d * act},
          {&BlockActs::ln2_mean, rows_l * stat},
          {&BlockActs::ln2_rstd, rows_l * stat},
          {&BlockActs::mlp_in, rows * g.f_l * act},
          {&BlockActs::mlp_act, rows * g.f_l * act}};
}

Status AllocateBlockActs(const Geometry& g, ModelKernels& k, Allocator& activations, BlockActs& a) {
  const int64_t saved = k.AttentionSavedBytes(g.batch, g.seq, g.h_l);
  for (const BlockActBuffer& b : BlockActPlan(g, static_cast<int64_t>(k.act_size()),
                                              static_cast<int64_t>(k.stat_size()), saved)) {
    ZR_ASSIGN_OR_RETURN(a.*b.member,
                        activations.Allocate(static_cast<size_t>(b.bytes),
                                             MemoryCategory::kActivations, &k.stream()));
  }
  return absl::OkStatus();
}

}  // namespace zerort::decoder
