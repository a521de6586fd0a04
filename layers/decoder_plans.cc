#include "zerort/layers/decoder_plans.h"

#include <algorithm>

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
  g.d_l = c.attention_channels() / g.t;
  g.h_l = c.n_head / g.t;
  g.f_l = c.ffn_channels() / g.t;
  g.f = c.features();
  g.hs = c.head_size();
  g.kv_l = c.kv_heads() / g.t;
  g.eps = static_cast<float>(c.norm_eps);
  g.rope = Rope{.theta = c.rope_theta, .scaling = c.rope_scaling, .seq_len = c.seq_len};
  g.v_l = static_cast<int>(PaddedVocab(c, g.t, vocab_multiple) / g.t);
  g.v_begin = g.r * g.v_l;
  g.v_valid = std::clamp(c.vocab_size - g.v_begin, 0, g.v_l);
  return g;
}

std::vector<ScratchBuffer> BackwardScratchPlan(const Geometry& g, int64_t act, int64_t grad,
                                               bool head_gave_dbtc) {
  std::vector<ScratchBuffer> plan = {{&BackwardScratch::dres, g.rows_l * g.d * act}};
  if (!head_gave_dbtc) plan.push_back({&BackwardScratch::dbtc, g.rows * DbtcCols(g) * act});
  if (g.sp) {
    plan.push_back({&BackwardScratch::dfull, g.rows * g.d * act});
    plan.push_back({&BackwardScratch::dloc, g.rows_l * g.d * act});
  }
  // [Note: per-head norms under tensor parallelism]
  if (g.sp || QkNormGradsSummed(g)) {
    const int64_t qk = QkNormGradsSummed(g) ? 2 * int64_t{g.hs} : 0;
    plan.push_back({&BackwardScratch::norm, (QkNormGradOffset(g) + qk) * grad});
  }
  return plan;
}

std::vector<ScratchBuffer> BlockBackwardScratchPlan(const Geometry& g, int64_t act) {
  // d4a: the MLP's output gradient [rows, f_l], then d(qkv) [rows, (h_l + 2 kv_l) hs]. d4b:
  // d(mlp_in) (and d(up) after it for a gated MLP), then with Q, K, V projections of their own
  // d(q), d(k), d(v).
  const int64_t mlp = g.f.gated_mlp() ? 2 * int64_t{g.f_l} : g.f_l;
  const int64_t qkv = QkvCols(g);
  const int64_t projections = g.f.qkv == QkvKind::kRotary ? qkv : 0;
  return {{&BackwardScratch::d4a, g.rows * std::max<int64_t>(g.f_l, qkv) * act},
          {&BackwardScratch::d4b, g.rows * std::max<int64_t>(mlp, projections) * act}};
}

bool QkvFusedInLayout(const Geometry& g, int64_t alignment) {
  if (g.f.qkv != QkvKind::kRotary || g.f.qk_norm) return false;
  const int64_t q = int64_t{g.h_l} * g.hs, kv = int64_t{g.kv_l} * g.hs;
  auto whole = [alignment](int64_t elements) { return elements % alignment == 0; };
  // Q's and K's tensors end where the next begins (V's end is not another's start).
  return whole(q * g.d) && whole(kv * g.d) && (!g.f.qkv_bias || (whole(q) && whole(kv)));
}

internal::FlashAttentionShape AttentionShapeOf(const DecoderConfig& c, int tp, int batch) {
  return {batch, c.seq_len, c.n_head / tp, c.kv_heads() / tp, c.head_size()};
}

bool GateUpFusedInLayout(const Geometry& g, int64_t alignment) {
  if (!g.f.gated_mlp()) return false;
  const int64_t f = g.f_l;
  return (f * g.d) % alignment == 0 && (!g.f.mlp_bias || f % alignment == 0);
}

int64_t ProjectionScratchBytes(const Geometry& g, int64_t act) {
  return g.f.qkv == QkvKind::kRotary ? g.rows * QkvCols(g) * act : 0;
}

std::vector<BlockActBuffer> BlockActPlan(const Geometry& g, int64_t act, int64_t stat,
                                         int64_t attention_saved) {
  const int64_t rows = g.rows, rows_l = g.rows_l, d = g.d;
  const bool mean = g.f.norm_has_bias();  // LayerNorm saves the mean, RMSNorm does not
  std::vector<BlockActBuffer> plan;
  auto add = [&plan](Buffer BlockActs::*member, int64_t bytes) { plan.push_back({member, bytes}); };
  add(&BlockActs::ln1, rows * d * act);  // every row: the input of column layers
  if (mean) add(&BlockActs::ln1_mean, rows_l * stat);
  add(&BlockActs::ln1_rstd, rows_l * stat);
  if (g.f.qk_norm) {  // q's and k's heads before their norms, and each head's rstd
    add(&BlockActs::qk_pre, rows * (g.h_l + g.kv_l) * g.hs * act);
    add(&BlockActs::qk_rstd, rows * (g.h_l + g.kv_l) * stat);
  }
  add(&BlockActs::qkv, rows * QkvCols(g) * act);  // kRotary: after the rotation
  add(&BlockActs::atty, rows * g.d_l * act);
  // What the kernels' attention keeps for its backward (the CPU: a log-sum-exp per query).
  add(&BlockActs::att, attention_saved);
  add(&BlockActs::res2, rows_l * d * act);
  add(&BlockActs::ln2, rows * d * act);
  if (mean) add(&BlockActs::ln2_mean, rows_l * stat);
  add(&BlockActs::ln2_rstd, rows_l * stat);
  // fc, or the gate and the up projection
  add(&BlockActs::mlp_in, (g.f.gated_mlp() ? 2 : 1) * rows * g.f_l * act);
  add(&BlockActs::mlp_act, rows * g.f_l * act);
  return plan;
}

using Cat = MemoryCategory;

bool BoundaryUsed(const DecoderStagePart& part, int n_layer, int l) {
  return part.holds(l) || (l > 0 && part.holds(l - 1)) || (l == 0 && part.first) ||
         (l == n_layer && part.last);
}

std::vector<MbPlanned> SeqScratchPlan(const Geometry& g, int64_t act) {
  if (!g.sp) return {};
  return {{MbBuffer::kSeqLocal, 0, Cat::kWorkspace, g.rows_l * g.d * act},
          {MbBuffer::kSeqFull, 0, Cat::kWorkspace, g.rows * g.d * act}};
}

std::vector<MbPlanned> BeginPlan(const Geometry& g, const DecoderStagePart& part, int n_layer,
                                 int64_t act, bool targets, bool per_block) {
  std::vector<MbPlanned> plan = {{MbBuffer::kTokens, 0, Cat::kActivations, g.rows * 4}};
  if (targets) plan.push_back({MbBuffer::kTargets, 0, Cat::kActivations, g.rows * 4});
  if (!per_block) plan.push_back({MbBuffer::kBlockActs, 0, Cat::kActivations, 0});
  for (int l = 0; l <= n_layer; ++l) {
    if (BoundaryUsed(part, n_layer, l)) {
      plan.push_back({MbBuffer::kBoundary, l, Cat::kActivations, g.rows_l * g.d * act});
    }
  }
  for (const MbPlanned& p : SeqScratchPlan(g, act)) plan.push_back(p);
  return plan;
}

std::vector<MbPlanned> HeadNormPlan(const Geometry& g, int64_t act, int64_t stat) {
  if (!g.f.norm_has_bias()) {  // RMSNorm: no mean
    return {{MbBuffer::kLnf, 0, Cat::kActivations, g.rows * g.d * act},
            {MbBuffer::kLnfRstd, 0, Cat::kActivations, g.rows_l * stat}};
  }
  return {{MbBuffer::kLnf, 0, Cat::kActivations, g.rows * g.d * act},
          {MbBuffer::kLnfMean, 0, Cat::kActivations, g.rows_l * stat},
          {MbBuffer::kLnfRstd, 0, Cat::kActivations, g.rows_l * stat}};
}

std::vector<MbPlanned> HeadPlan(const Geometry& g, int64_t act, int64_t stat, bool targets,
                                bool train, int64_t chunk) {
  std::vector<MbPlanned> plan;
  if (targets) plan.push_back({MbBuffer::kLosses, 0, Cat::kActivations, g.rows * stat});
  if (train) plan.push_back({MbBuffer::kDbtc, 0, Cat::kWorkspace, g.rows * DbtcCols(g) * act});
  plan.push_back({MbBuffer::kLogits, 0, Cat::kWorkspace, chunk * g.v_l * act});
  return plan;
}

}  // namespace zerort::decoder
