// MemoryModelInput (validation, layouts, from a run config), the cold mode's decoder fit, the
// maximum over stages and the ZeRO paper's accounting: the memory model's inputs and summaries.
// The replay itself is step_model.cc.
#include <algorithm>
#include <cmath>

#include "zerort/config/run_options.h"
#include "zerort/estimate/memory_model.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/layers/pipeline_schedule.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/unit_plan.h"

namespace zerort {

Status MemoryModelInput::Validate() const {
  ZR_RETURN_IF_ERROR(model.Validate());
  auto positive = [](const char* what, int64_t v) -> Status {
    if (v < 1) return absl::InvalidArgumentError(StrCat(what, " = ", v, ": must be >= 1"));
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(positive("micro-batch", micro_batch));
  ZR_RETURN_IF_ERROR(positive("gradient accumulation", accumulation));
  ZR_RETURN_IF_ERROR(positive("data-parallel size", dp));
  ZR_RETURN_IF_ERROR(positive("tensor-parallel size", tp));
  ZR_RETURN_IF_ERROR(positive("pipeline-parallel size", pp));
  if (stage() < 0 || stage() > 3) return absl::InvalidArgumentError(StrCat("ZeRO stage ", stage()));
  if (model.n_head % tp != 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor-parallel size ", tp, " does not divide the heads (", model.n_head, ")"));
  }
  if (model.d_model % tp != 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor-parallel size ", tp, " does not divide d_model (", model.d_model, ")"));
  }
  ZR_RETURN_IF_ERROR(positive("make_vocab_size_divisible_by", vocab_multiple));
  if (head_chunk_rows < 0) {
    return absl::InvalidArgumentError(
        StrCat("model.head_chunk_rows = ", head_chunk_rows, ": must be >= 0 (0: automatic)"));
  }
  if (cuda) {
    ZR_RETURN_IF_ERROR(internal::CheckAttentionBackend(
        attention, flash_tiles, compute(), decoder::AttentionShapeOf(model, tp, micro_batch)));
  }
  if (pipeline_stage < 0 || pipeline_stage >= pp) {
    return absl::InvalidArgumentError(
        StrCat("pipeline stage ", pipeline_stage, " of ", pp, " stages"));
  }
  if (pp > 1) {
    ZR_ASSIGN_OR_RETURN(const PipelineSchedule schedule, ParsePipelineSchedule(pipeline_schedule));
    ZR_RETURN_IF_ERROR(ValidatePipelineShape({schedule, pp, accumulation, virtual_stages}));
  }
  ZR_RETURN_IF_ERROR(
      StageChunks(model.n_layer, pp, virtual_stages, pipeline_layers, pipeline_stage).status());
  if (manager.placement.optimizer != MemoryTier::kDevice && stage() == 0) {
    return absl::InvalidArgumentError("offload_optimizer needs ZeRO stage 1 or higher");
  }
  if (manager.placement.params != MemoryTier::kDevice && stage() != 3) {
    return absl::InvalidArgumentError("offload_param needs ZeRO stage 3");
  }
  return absl::OkStatus();
}

int MemoryModelInput::optimizer_states() const { return OptimizerStateCount(manager.optimizer); }

// Megatron's order: this stage's first data group starts at world rank stage x dp x tp; its data
// ranks are tp apart, a shard group's first S of them, a replicate group every S-th.
bool MemoryModelInput::ShardGroupCrossesNodes() const {
  return SpansNodes(pipeline_stage * dp * tp, tp, shard_ranks(), ranks_per_node);
}
bool MemoryModelInput::SecondaryCrossesNodes() const {
  return SpansNodes(pipeline_stage * dp * tp, tp, manager.hpz_partition_size, ranks_per_node);
}
bool MemoryModelInput::ReplicasCrossNodes() const {
  return SpansNodes(pipeline_stage * dp * tp, shard_ranks() * tp, replicas(), ranks_per_node);
}

MemoryModelInput MemoryModelInput::WithoutShape(int blocks) const {
  MemoryModelInput in = *this;
  in.model = DecoderConfig{
      .n_layer = std::max(1, blocks), .n_head = 1, .d_model = 1, .seq_len = 1, .vocab_size = 1};
  in.micro_batch = 1;
  in.tp = 1;
  in.sequence_parallel = false;
  in.pp = 1;
  in.pipeline_stage = 0;
  in.pipeline_layers.clear();
  return in;
}

void MemoryModelInput::SetLayout(int zero_stage, const std::string& offload) {
  manager.stage = static_cast<ZeroStage>(zero_stage);
  OffloadConfig placed;  // pinned host memory for "cpu", as the config's default
  placed.device = offload;
  const MemoryTier tier = OffloadTier(placed);
  manager.placement.optimizer = tier;
  manager.placement.params = zero_stage == 3 ? tier : MemoryTier::kDevice;
}

StatusOr<MemoryModelInput> MemoryModelInput::FromConfig(const RunConfig& config, int world_size,
                                                        bool cuda) {
  RunConfig c = config;
  const int tp = c.parallel.tensor_parallel_size;
  const int pp = c.parallel.pipeline_parallel_size;
  if (world_size < 1 || world_size % (tp * pp) != 0) {
    return absl::InvalidArgumentError(
        StrCat("parallel.tensor_parallel_size x pipeline_parallel_size = ", tp, " x ", pp,
               " does not divide --world-size ", world_size));
  }
  const int dp = world_size / (tp * pp);
  ZR_RETURN_IF_ERROR(ResolveBatch(
      c, dp,
      StrCat("--world-size ", world_size, " / (tensor x pipeline parallel size ", tp * pp, ")")));
  MemoryModelInput in;
  in.model = c.model.shape;
  in.micro_batch = static_cast<int>(c.train_micro_batch_size_per_gpu);
  in.accumulation = static_cast<int>(c.gradient_accumulation_steps);
  in.dp = dp;
  in.ranks_per_node = world_size;  // every rank on one node unless the caller says otherwise
  in.data_shard = c.parallel.data_shard_size;
  if (in.data_shard > 0 && dp % in.data_shard != 0) {
    return absl::InvalidArgumentError(StrCat("parallel.data_shard_size = ", in.data_shard,
                                             " does not divide the data-parallel size ", dp));
  }
  in.tp = c.parallel.tensor_parallel_size;
  in.sequence_parallel = c.parallel.sequence_parallel;
  in.vocab_multiple = c.parallel.make_vocab_size_divisible_by;
  in.pp = pp;
  in.pipeline_schedule = c.parallel.pipeline_schedule;
  in.virtual_stages = c.parallel.virtual_pipeline_stages;
  in.pipeline_layers = c.parallel.pipeline_layers;
  in.activation_checkpointing = c.model.activation_checkpointing;
  in.head_chunk_rows = c.model.head_chunk_rows;
  in.cuda = cuda;
  in.attention = AttentionBackendNamed(c.model.attention_backend);
  in.flash_tiles = c.model.flash_attention;
  in.manager = ShardManagerOptionsFrom(c, dp);  // what `zerort train` creates
  return in;
}

StatusOr<ColdDecoder> FitColdDecoder(int64_t params, int64_t largest) {
  if (largest < 1 || largest > params) {
    return absl::InvalidArgumentError(
        StrCat("the largest layer's ", largest, " parameters must be in [1, ", params, "]"));
  }
  constexpr int64_t kEmbeddingRows = 50257 + 1024;  // GPT-2's wte and wpe rows
  // In doubles: d reaches L / 51281, whose 12 d^2 passes 2^63 for L near 1e15.
  auto block = [](int64_t d) {
    const double x = static_cast<double>(d);
    return 12.0 * x * x + 13.0 * x;
  };
  ColdDecoder c;
  c.d = std::max<int64_t>(1, largest / kEmbeddingRows);
  int64_t embedding = largest;
  const auto fits = [&](int64_t d) { return block(d) <= static_cast<double>(largest); };
  c.embedding_largest = fits(c.d);
  int64_t block_size = c.embedding_largest ? static_cast<int64_t>(block(c.d)) : largest;
  if (!c.embedding_largest) {
    // A block is the largest layer: the d whose block holds at most `largest`.
    c.d = static_cast<int64_t>((std::sqrt(169.0 + 48.0 * static_cast<double>(largest)) - 13.0) /
                               24.0);
    while (fits(c.d + 1)) ++c.d;
    while (c.d > 1 && !fits(c.d)) --c.d;
    c.d = std::max<int64_t>(c.d, 1);  // a layer of fewer than 25 parameters
    block_size = largest;
    embedding = std::max<int64_t>(1, std::min({kEmbeddingRows * c.d, params - largest, largest}));
    if (params == largest) embedding = largest;  // one layer: the embedding's role
  }
  int64_t rest = params - embedding;
  const int64_t norm = std::min({2 * c.d, rest, largest});
  rest -= norm;
  if (rest / block_size > 4096) {
    return absl::InvalidArgumentError(StrCat(
        params, " parameters in layers of at most ", largest,
        " are more than 4096 of them: ", "not modelled (the replay holds at most 4096 blocks)"));
  }
  c.units.push_back(embedding);
  for (; rest >= block_size; rest -= block_size) c.units.push_back(block_size);
  if (rest > 0) c.units.push_back(rest);
  c.blocks = static_cast<int>(c.units.size()) - 1;
  if (norm > 0) c.units.push_back(norm);
  c.has_norm = norm > 0;
  return c;
}

StatusOr<std::vector<MemoryEstimate>> EstimateMemoryPerStage(const MemoryModelInput& input) {
  std::vector<MemoryEstimate> out;
  for (int s = 0; s < input.pp; ++s) {
    MemoryModelInput in = input;
    in.pipeline_stage = s;
    ZR_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(in));
    out.push_back(std::move(e));
  }
  return out;
}

MemorySnapshot MaxOverStages(const std::vector<MemorySnapshot>& snapshots) {
  MemorySnapshot out;
  auto take = [](MemoryUsage& into, const MemoryUsage& from) {
    into.peak = std::max(into.peak, from.peak);
    into.current = std::max(into.current, from.current);
  };
  for (const MemorySnapshot& s : snapshots) {
    for (int t = 0; t < kNumMemoryTiers; ++t) {
      for (int k = 0; k < kNumMemoryCategories; ++k)
        take(out.by_category[t][k], s.by_category[t][k]);
      take(out.in_use[t], s.in_use[t]);
      take(out.reserved[t], s.reserved[t]);
    }
  }
  return out;
}

double ZeroPaperModelStates(double params, int ranks, int stage, double k) {
  const double n = ranks;
  switch (stage) {
    case 0:
      return (2 + 2 + k) * params;
    case 1:
      return 2 * params + 2 * params + k * params / n;
    case 2:
      return 2 * params + (2 + k) * params / n;
    default:
      return (2 + 2 + k) * params / n;
  }
}

}  // namespace zerort
