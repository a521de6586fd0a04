// The memory model: a replay of one steady-state training step's allocations.
#include "zerort/estimate/memory_model.h"

#include <algorithm>

#include "zerort/estimate/step_model.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

using namespace memory_internal;

// A unit of `params` laid out and planned as the runtime does (FlatLayout over the stage's shard
// count, UnitPlan, its optimizer tier as ShardManager::PlaceOptimizerState gives it to the unit
// `units.size()` of `count`), appended to `units` and counted in `out.parameters`; its index.
StatusOr<int> AddUnit(const MemoryModelInput& in, const ShardManagerOptions& options,
                      const std::vector<ParamSpec>& params, int count, std::vector<Unit>& units,
                      MemoryEstimate& out) {
  for (const ParamSpec& p : params) out.parameters += p.numel();
  ZR_ASSIGN_OR_RETURN(FlatLayout layout,
                      FlatLayout::Create(params, ShardCount(in.manager.stage, in.shard_ranks())));
  const MemoryTier tier = UnitOptimizerTier(options, static_cast<int>(units.size()), count);
  UnitPlan plan = PlanUnit(options, layout, in.shard_ranks(), tier);
  units.push_back(Unit{std::move(layout), std::move(plan)});
  return static_cast<int>(units.size()) - 1;
}

}  // namespace

StatusOr<MemoryEstimate> EstimateMemory(const MemoryModelInput& in) {
  ZR_RETURN_IF_ERROR(in.Validate());
  // The units of this rank: the runtime's own parameter list, split as tensor parallelism
  // splits it, and the stage's share of it as the runtime splits it (DecoderModel::Create).
  // Rank 0's parameters: every tensor-parallel rank's parts have the same shapes.
  ZR_ASSIGN_OR_RETURN(std::vector<DecoderUnit> all,
                      DecoderUnits(in.model, in.tp, 0, in.vocab_multiple));
  const int L = in.model.n_layer;
  DecoderStagePart part;
  part.first = in.pipeline_stage == 0;
  part.last = in.pipeline_stage == in.pp - 1;
  if (in.pp > 1) {
    ZR_ASSIGN_OR_RETURN(part.chunks, StageChunks(L, in.pp, in.virtual_stages, in.pipeline_layers,
                                                 in.pipeline_stage));
  }
  StageUnits stage;
  stage.first = part.first;
  stage.last = part.last;
  std::vector<Unit> units;
  MemoryEstimate out;
  const ShardManagerOptions& options = in.manager;
  // The rank's units in registration order, then planned: their count places the optimizer
  // state ([Note: partial optimizer offload]).
  std::vector<const DecoderUnit*> order;
  auto take = [&](const DecoderUnit& unit) {
    order.push_back(&unit);
    return static_cast<int>(order.size()) - 1;
  };
  if (part.first || (part.last && in.model.tied())) stage.embedding = take(all[0]);
  for (int l = 0; l < L; ++l) {
    if (part.holds(l)) stage.blocks.push_back(take(all[1 + l]));
  }
  if (part.last) {
    stage.norm = take(all[L + 1]);
    if (!in.model.tied()) stage.head = take(all[L + 2]);
  }
  for (const DecoderUnit* unit : order) {
    ZR_RETURN_IF_ERROR(
        AddUnit(in, options, unit->params, static_cast<int>(order.size()), units, out).status());
  }
  stage.part = part;
  if (in.pp > 1) {
    ZR_ASSIGN_OR_RETURN(const PipelineSchedule schedule,
                        ParsePipelineSchedule(in.pipeline_schedule));
    ZR_ASSIGN_OR_RETURN(
        const std::vector<PipelineAction> actions,
        PipelineActions({schedule, in.pp, in.accumulation, in.virtual_stages}, in.pipeline_stage));
    const StageLiveness live = PipelineStageLiveness(actions, part.chunks, in.virtual_stages);
    stage.live = live.micro_batches;
    stage.live_sets = live.block_sets;
    stage.backward_live = live.backward;
    stage.head_live = part.last ? live.head : 0;
  }
  StepModel model(in, std::move(units), std::move(stage), out);
  model.Run();
  return out;
}

StatusOr<MemoryEstimate> EstimateColdModelStates(const MemoryModelInput& layout, int64_t params,
                                                 int64_t largest) {
  ZR_ASSIGN_OR_RETURN(const ColdDecoder decoder, FitColdDecoder(params, largest));
  const MemoryModelInput in = layout.WithoutShape(decoder.blocks);
  ZR_RETURN_IF_ERROR(in.Validate());
  const ShardManagerOptions& options = in.manager;
  MemoryEstimate out;
  std::vector<Unit> units;
  StageUnits stage;
  for (size_t i = 0; i < decoder.units.size(); ++i) {
    ParamSpec spec;
    spec.name = StrCat("unit", i);
    spec.shape = {decoder.units[i]};
    ZR_ASSIGN_OR_RETURN(const int u, AddUnit(in, options, {spec},
                                             static_cast<int>(decoder.units.size()), units, out));
    if (i == 0) {
      stage.embedding = u;
    } else if (decoder.has_norm && i + 1 == decoder.units.size()) {
      stage.norm = u;
    } else {
      stage.blocks.push_back(u);
    }
  }
  StepModel model(in, std::move(units), std::move(stage), out, /*model_states_only=*/true);
  model.Run();
  return out;
}

}  // namespace zerort
