// A LLaMA-family block over ModelKernels (decoder_block.h): RMSNorm, Q/K/V projections with grouped
// key/value heads (with qk_norm, Qwen3's, each head of q and k RMSNorm-ed), rotary embeddings,
// causal attention, the output projection, RMSNorm, the SwiGLU MLP; under tensor and sequence
// parallelism through the same transitions as GPT-2's block (NormToColumn, RowToResidual,
// ReduceColumnInputGrad, NormBackward).
#include "zerort/layers/decoder_block.h"

namespace zerort::decoder {
namespace {

// Element offsets of q, k and v in a [rows, (h_l + 2 kv_l) hs] buffer of the three side by side.
struct Projections {
  int64_t k = 0, v = 0;
  int q_cols = 0, kv_cols = 0;
};
Projections Split(const Geometry& g) {
  Projections p;
  p.q_cols = g.h_l * g.hs;
  p.kv_cols = g.kv_l * g.hs;
  p.k = g.rows * p.q_cols;
  p.v = p.k + g.rows * p.kv_cols;
  return p;
}

void* At(void* base, int64_t elements, size_t size) {
  return static_cast<std::byte*>(base) + elements * static_cast<int64_t>(size);
}

// A block's tensors by LlamaParam: the unit's parameters or gradients, null where the config has
// no such bias.
class Slots {
 public:
  Slots(const Geometry& g, const std::vector<void*>& tensors) : g_(g), tensors_(tensors) {}
  void* operator[](LlamaParam p) const {
    const int slot = LlamaSlot(g_, p);
    return slot < 0 ? nullptr : tensors_[static_cast<size_t>(slot)];
  }

 private:
  const Geometry& g_;
  const std::vector<void*>& tensors_;
};

// Whether tensor `b` among `tensors` starts where `a`, of `elements` elements of `size` bytes,
// ends.
bool Follows(const Slots& tensors, LlamaParam a, LlamaParam b, int64_t elements, size_t size) {
  return static_cast<const std::byte*>(tensors[a]) + elements * static_cast<int64_t>(size) ==
         tensors[b];
}

// [Note: a LLaMA block's projections]: whether Q, K and V's weights (and biases, where the block
// has them) among `tensors` lie back to back, elements of `size` bytes: one [(h_l + 2 kv_l) hs, d]
// weight whose single GEMM writes qkv's layout. Never with per-head norms (qk_norm), which
// normalise q and k between the projections and the rotation (QkvFusedInLayout says the same).
bool QkvContiguous(const Geometry& g, const Slots& tensors, size_t size) {
  if (g.f.qk_norm) return false;
  const Projections p = Split(g);
  const bool weights = Follows(tensors, kQW, kKW, int64_t{p.q_cols} * g.d, size) &&
                       Follows(tensors, kKW, kVW, int64_t{p.kv_cols} * g.d, size);
  if (!weights || !g.f.qkv_bias) return weights;
  return Follows(tensors, kQB, kKB, p.q_cols, size) && Follows(tensors, kKB, kVB, p.kv_cols, size);
}

// The same for the MLP's gate and up projections: one [2 f_l, d] weight.
bool GateUpContiguous(const Geometry& g, const Slots& tensors, size_t size) {
  const bool weights = Follows(tensors, kGateW, kUpW, int64_t{g.f_l} * g.d, size);
  return weights && (!g.f.mlp_bias || Follows(tensors, kGateB, kUpB, g.f_l, size));
}

}  // namespace

Status LlamaBlockForward(const Ctx& c, const std::vector<void*>& params, const void* x,
                         BlockActs& a, void* out) {
  const Geometry& g = c.g;
  ModelKernels& k = c.k;
  const size_t act = k.act_size();
  const Slots w(g, params);
  ZR_RETURN_IF_ERROR(
      NormToColumn(c, a.ln1.data(), nullptr, a.ln1_rstd.data(), x, w[kAttnNorm], nullptr));
  if (QkvContiguous(g, w, act)) {
    // [Note: a LLaMA block's projections]: one GEMM writes q, k, v in qkv's layout, turned there.
    ZR_RETURN_IF_ERROR(k.Matmul(a.qkv.data(), a.ln1.data(), w[kQW], w[kQB], g.rows, g.d,
                                static_cast<int>(QkvCols(g))));
    ZR_RETURN_IF_ERROR(
        k.RopeQkvInPlace(a.qkv.data(), g.batch, g.seq, g.h_l, g.kv_l, g.hs, g.rope, false));
  } else {
    // [Note: a LLaMA block's projections]: this rank's query heads and key/value heads, then
    // rotated into qkv ([Note: the qkv layout]: each key/value head once).
    ZR_ASSIGN_OR_RETURN(
        Buffer proj, c.tp.workspace->Allocate(static_cast<size_t>(ProjectionScratchBytes(g, act)),
                                              MemoryCategory::kWorkspace, &k.stream()));
    const Projections p = Split(g);
    void* q = proj.data();
    void* kk = At(proj.data(), p.k, act);
    void* v = At(proj.data(), p.v, act);
    if (g.f.qk_norm) {
      // Qwen3: q and k projected into qk_pre (saved), each head RMSNorm-ed into the scratch.
      void* q_pre = a.qk_pre.data();
      void* k_pre = At(a.qk_pre.data(), p.k, act);
      ZR_RETURN_IF_ERROR(k.Matmul(q_pre, a.ln1.data(), w[kQW], w[kQB], g.rows, g.d, p.q_cols));
      ZR_RETURN_IF_ERROR(k.Matmul(k_pre, a.ln1.data(), w[kKW], w[kKB], g.rows, g.d, p.kv_cols));
      ZR_RETURN_IF_ERROR(
          k.RmsNorm(q, a.qk_rstd.data(), q_pre, w[kQNorm], g.rows * g.h_l, g.hs, g.eps));
      ZR_RETURN_IF_ERROR(k.RmsNorm(kk, At(a.qk_rstd.data(), g.rows * g.h_l, k.stat_size()), k_pre,
                                   w[kKNorm], g.rows * g.kv_l, g.hs, g.eps));
    } else {
      ZR_RETURN_IF_ERROR(k.Matmul(q, a.ln1.data(), w[kQW], w[kQB], g.rows, g.d, p.q_cols));
      ZR_RETURN_IF_ERROR(k.Matmul(kk, a.ln1.data(), w[kKW], w[kKB], g.rows, g.d, p.kv_cols));
    }
    ZR_RETURN_IF_ERROR(k.Matmul(v, a.ln1.data(), w[kVW], w[kVB], g.rows, g.d, p.kv_cols));
    ZR_RETURN_IF_ERROR(
        k.RopeQkv(a.qkv.data(), q, kk, v, g.batch, g.seq, g.h_l, g.kv_l, g.hs, g.rope));
  }
  ZR_RETURN_IF_ERROR(
      k.Attention(a.atty.data(), a.att.data(), a.qkv.data(), g.batch, g.seq, g.d_l, g.h_l, g.kv_l));
  ZR_RETURN_IF_ERROR(RowToResidual(c, a.res2.data(), a.atty.data(), w[kOW], w[kOB], g.d_l));
  // res2 += x, then ln2 = RmsNorm(res2).
  ZR_RETURN_IF_ERROR(AddNormToColumn(c, a.ln2.data(), nullptr, a.ln2_rstd.data(), a.res2.data(), x,
                                     w[kMlpNorm], nullptr));
  // Gate and up: one GEMM into a row's gate then its up, or two GEMMs side by side.
  const bool gate_up = GateUpContiguous(g, w, act);
  if (gate_up) {
    ZR_RETURN_IF_ERROR(
        k.Matmul(a.mlp_in.data(), a.ln2.data(), w[kGateW], w[kGateB], g.rows, g.d, 2 * g.f_l));
  } else {
    ZR_RETURN_IF_ERROR(
        k.Matmul(a.mlp_in.data(), a.ln2.data(), w[kGateW], w[kGateB], g.rows, g.d, g.f_l));
    ZR_RETURN_IF_ERROR(k.Matmul(At(a.mlp_in.data(), g.rows * g.f_l, act), a.ln2.data(), w[kUpW],
                                w[kUpB], g.rows, g.d, g.f_l));
  }
  ZR_RETURN_IF_ERROR(k.SwiGlu(a.mlp_act.data(), a.mlp_in.data(), g.rows, g.f_l, gate_up));
  return RowToResidualAdd(c, out, a.mlp_act.data(), w[kDownW], w[kDownB], g.f_l, a.res2.data());
}

Status LlamaBlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                          BackwardScratch& s) {
  const Geometry& g = c.g;
  ModelKernels& k = c.k;
  const Device dev = k.device();
  Stream* st = &k.stream();
  const Slots w(g, u.params), gr(g, u.grads);
  const size_t act = k.act_size();
  const int64_t mlp = g.rows * g.f_l;
  // MLP: row-parallel down projection, SwiGLU, column-parallel gate and up.
  ZR_ASSIGN_OR_RETURN(const void* dout, ResidualGradOfEveryRow(c, s));
  ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.d4a.data(), gr[kDownW], gr[kDownB], dout,
                                           a.mlp_act.data(), w[kDownW], g.rows, g.f_l, g.d));
  // d(gate, up) in mlp_in's layout (the forward's: one GEMM's output when the weights are one).
  const bool gate_up = GateUpContiguous(g, w, act);
  if (gate_up && !GateUpContiguous(g, gr, k.grad_size())) {
    return absl::FailedPreconditionError(
        "a LLaMA block's gate and up weights lie back to back but their gradients do not: the "
        "unit's gradients must be laid out as its parameters");
  }
  ZR_RETURN_IF_ERROR(
      k.SwiGluBackward(s.d4b.data(), s.d4a.data(), a.mlp_in.data(), g.rows, g.f_l, gate_up));
  if (gate_up) {
    ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kGateW], gr[kGateB], s.d4b.data(),
                                             a.ln2.data(), w[kGateW], g.rows, g.d, 2 * g.f_l));
  } else {
    ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kGateW], gr[kGateB], s.d4b.data(),
                                             a.ln2.data(), w[kGateW], g.rows, g.d, g.f_l));
    ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kUpW], gr[kUpB],
                                        At(s.d4b.data(), mlp, act), a.ln2.data(), w[kUpW], g.rows,
                                        g.d, g.f_l));
  }
  ZR_ASSIGN_OR_RETURN(const void* dln2, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(NormBackward(c, s, 0, dln2, a.res2.data(), u.params, u.grads, kMlpNorm,
                                  nullptr, a.ln2_rstd.data()));
  // Attention: row-parallel output projection, this rank's heads, the rotation's transpose, the
  // column-parallel Q, K, V.
  ZR_ASSIGN_OR_RETURN(dout, ResidualGradOfEveryRow(c, s));
  ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kOW], gr[kOB], dout, a.atty.data(),
                                           w[kOW], g.rows, g.d_l, g.d));
  ZR_RETURN_IF_ERROR(k.AttentionBackward(s.d4a.data(), s.dbtc.data(), a.qkv.data(), a.atty.data(),
                                         a.att.data(), g.batch, g.seq, g.d_l, g.h_l, g.kv_l));
  if (QkvContiguous(g, w, act) && QkvContiguous(g, gr, k.grad_size())) {
    // dqkv turned back in place, then one GEMM's input and weight gradients for Q, K and V.
    ZR_RETURN_IF_ERROR(
        k.RopeQkvInPlace(s.d4a.data(), g.batch, g.seq, g.h_l, g.kv_l, g.hs, g.rope, true));
    ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kQW], gr[kQB], s.d4a.data(),
                                             a.ln1.data(), w[kQW], g.rows, g.d,
                                             static_cast<int>(QkvCols(g))));
  } else {
    const Projections p = Split(g);
    void* dq = s.d4b.data();
    void* dk = At(s.d4b.data(), p.k, act);
    void* dv = At(s.d4b.data(), p.v, act);
    ZR_RETURN_IF_ERROR(FillZero(s.d4b.data(), dev, p.v * act + g.rows * p.kv_cols * act, st));
    ZR_RETURN_IF_ERROR(
        k.RopeQkvBackward(dq, dk, dv, s.d4a.data(), g.batch, g.seq, g.h_l, g.kv_l, g.hs, g.rope));
    if (g.f.qk_norm) {
      // Back through q's and k's per-head norms into d4a (dqkv, read by the rotation's backward,
      // is spent); the gains' gradients per [Note: per-head norms under tensor parallelism].
      void* dq_pre = s.d4a.data();
      void* dk_pre = At(s.d4a.data(), p.k, act);
      ZR_RETURN_IF_ERROR(FillZero(s.d4a.data(), dev, p.v * act, st));
      void* dwq = gr[kQNorm];
      void* dwk = gr[kKNorm];
      if (QkNormGradsSummed(g)) {
        dwq = At(s.norm.data(), QkNormGradOffset(g), k.grad_size());
        dwk = At(dwq, g.hs, k.grad_size());
      }
      ZR_RETURN_IF_ERROR(k.RmsNormBackward(dq_pre, dwq, dq, a.qk_pre.data(), w[kQNorm],
                                           a.qk_rstd.data(), g.rows * g.h_l, g.hs));
      ZR_RETURN_IF_ERROR(k.RmsNormBackward(
          dk_pre, dwk, dk, At(a.qk_pre.data(), p.k, act), w[kKNorm],
          At(a.qk_rstd.data(), g.rows * g.h_l, k.stat_size()), g.rows * g.kv_l, g.hs));
      dq = dq_pre;
      dk = dk_pre;
    }
    ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(s.dbtc.data(), gr[kQW], gr[kQB], dq, a.ln1.data(),
                                             w[kQW], g.rows, g.d, p.q_cols));
    ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kKW], gr[kKB], dk, a.ln1.data(), w[kKW],
                                        g.rows, g.d, p.kv_cols));
    ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), gr[kVW], gr[kVB], dv, a.ln1.data(), w[kVW],
                                        g.rows, g.d, p.kv_cols));
  }
  ZR_ASSIGN_OR_RETURN(const void* dln1, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(
      NormBackward(c, s, 1, dln1, x, u.params, u.grads, kAttnNorm, nullptr, a.ln1_rstd.data()));
  return ReduceNormGrads(c, s, {{gr[kMlpNorm], nullptr}, {gr[kAttnNorm], nullptr}},
                         {gr[kQNorm], gr[kKNorm]});
}

}  // namespace zerort::decoder
