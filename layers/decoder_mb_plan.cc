#include "zerort/layers/decoder_mb_plan.h"

namespace zerort::decoder {

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
  if (g.llama) {  // RMSNorm: no mean
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
  if (train) plan.push_back({MbBuffer::kDbtc, 0, Cat::kWorkspace, g.rows * g.d * act});
  plan.push_back({MbBuffer::kLogits, 0, Cat::kWorkspace, chunk * g.v_l * act});
  return plan;
}

}  // namespace zerort::decoder
