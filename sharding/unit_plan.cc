// UnitPlan: which buffers a unit keeps, where, and for how long.
#include "zerort/sharding/unit_plan.h"

#include "zerort/sharding/compressed_allreduce.h"

namespace zerort {

std::string_view UnitBufferName(UnitBuffer buffer) {
  switch (buffer) {
    case UnitBuffer::kMaster:
      return "master";
    case UnitBuffer::kExpAvg:
      return "exp_avg";
    case UnitBuffer::kExpAvgSq:
      return "exp_avg_sq";
    case UnitBuffer::kGradShard:
      return "gradient shard";
    case UnitBuffer::kComputeShard:
      return "compute shard";
    case UnitBuffer::kComputeFull:
      return "full compute parameters";
    case UnitBuffer::kGathered:
      return "gathered parameters";
    case UnitBuffer::kSecondary:
      return "secondary";
    case UnitBuffer::kFullGrad:
      return "full gradient";
    case UnitBuffer::kWorkerError:
      return "1-bit worker error";
    case UnitBuffer::kServerError:
      return "1-bit server error";
    case UnitBuffer::kAccumulator:
      return "0/1 Adam accumulator";
    case UnitBuffer::kExpAvgSqFresh:
      return "exp_avg_sq_fresh";
    case UnitBuffer::kFusedMomentum:
      return "1-bit LAMB fused momentum";
  }
  return "invalid";
}

const PlannedBuffer* UnitPlan::Find(UnitBuffer buffer) const {
  for (const PlannedBuffer& b : buffers) {
    if (b.buffer == buffer) return &b;
  }
  return nullptr;
}

int ShardCount(ZeroStage stage, int dp_size) { return stage == ZeroStage::k0 ? 1 : dp_size; }

int OptimizerStateCount(const OptimizerOptions& optimizer) {
  if (optimizer.kind != OptimizerKind::kSgd) return 2;
  return optimizer.momentum != 0.0f ? 1 : 0;
}

// [Note: one shard rank]
// ZeRO-3 over a shard group of one rank (one GPU, or hybrid sharding with shard size 1) shards
// nothing: the unit's one shard is its whole flat vector. Gathering it would copy the compute
// shard into a second buffer of the same size before every forward and backward use, and free
// it after (on the CPU a GPT of 30M parameters stepped 1.06x as long at stage 3 as at stage 0;
// 1.01x reading in place, docs/benchmarks.md). So the unit reads its compute shard in place, as
// PyTorch's FSDP1 falls back to NO_SHARD at world size 1: the plan marks it persistent (the
// shard manager never gathers, prefetches or releases it) and has no gathered buffer; the
// optimizer's updates land in the compute shard as at any stage 3, and a checkpoint is the same
// stage-3 checkpoint. Not where the compute shard is offloaded (it must come to the device;
// units below stage3_param_persistence_threshold keep theirs on the device and do), not under
// qwZ (every gather quantizes, the rank's own shard too) and not under poison_released (which
// exists to make a weight read outside its scope visible; a shard read in place is never
// poisoned).
bool GathersInPlace(const ShardManagerOptions& o, const FlatLayout& layout, int data_ranks) {
  const bool on_device = o.placement.params == MemoryTier::kDevice ||
                         layout.padded_numel() < o.stage3_param_persistence_threshold;
  return o.stage == ZeroStage::k3 && data_ranks == 1 &&
         layout.shard_numel() == layout.padded_numel() && on_device && !o.quantized_weights &&
         !o.poison_released && o.hpz_partition_size <= 1;
}

UnitPlan PlanUnit(const ShardManagerOptions& o, const FlatLayout& layout, int data_ranks,
                  MemoryTier opt_tier) {
  UnitPlan plan;
  const int64_t shard = layout.shard_numel();
  const int64_t padded = layout.padded_numel();
  plan.partitioning = o.stage == ZeroStage::k0 ? Partitioning::kReplicated : Partitioning::kSharded;
  plan.sharded_params = o.stage == ZeroStage::k3;
  plan.gathers_in_place = GathersInPlace(o, layout, data_ranks);
  plan.persistent = !plan.sharded_params || padded < o.stage3_param_persistence_threshold ||
                    plan.gathers_in_place;
  plan.compute_is_master = o.stage == ZeroStage::k0 && o.compute_dtype == DType::kF32;

  using C = MemoryCategory;
  auto add = [&](UnitBuffer b, int64_t numel, DType dtype, MemoryTier tier, C category,
                 Lifetime lifetime = Lifetime::kPersistent) {
    plan.buffers.push_back({b, numel, dtype, tier, category, lifetime});
  };
  add(UnitBuffer::kMaster, shard, DType::kF32, opt_tier, C::kParameters);
  const int states = OptimizerStateCount(o.optimizer);
  if (states >= 1) add(UnitBuffer::kExpAvg, shard, DType::kF32, opt_tier, C::kOptimizerState);
  if (states >= 2) add(UnitBuffer::kExpAvgSq, shard, DType::kF32, opt_tier, C::kOptimizerState);
  // [Note: gradient sums on the device]: a host-tier unit's gradient shard on the device.
  const bool host_tier = opt_tier == MemoryTier::kHost || opt_tier == MemoryTier::kPinnedHost;
  add(UnitBuffer::kGradShard, shard, DType::kF32,
      host_tier && o.offload.device_grad_sums ? MemoryTier::kDevice : opt_tier, C::kGradients);
  if (o.optimizer.kind == OptimizerKind::kZeroOneAdam) {
    add(UnitBuffer::kAccumulator, shard, DType::kF32, opt_tier, C::kOptimizerState);
  }
  if (o.optimizer.kind == OptimizerKind::kOneBitLamb) {
    add(UnitBuffer::kExpAvgSqFresh, shard, DType::kF32, opt_tier, C::kOptimizerState);
  }
  if (IsOneBit(o.optimizer.kind) && o.optimizer.kind != OptimizerKind::kOneBitLamb &&
      data_ranks > 1) {
    const int64_t worker = OneBitAllReduce::WorkerErrorNumel(OneBitSegments(layout), data_ranks);
    add(UnitBuffer::kWorkerError, worker, DType::kF32, opt_tier, C::kOptimizerState);
    add(UnitBuffer::kServerError, worker / data_ranks, DType::kF32, opt_tier, C::kOptimizerState);
  }
  if (plan.sharded_params) {
    // Persistent units stay gathered on the device, so their shard stays there too (as
    // DeepSpeed keeps parameters below the persistence threshold on the GPU).
    const MemoryTier tier = plan.persistent ? MemoryTier::kDevice : o.placement.params;
    add(UnitBuffer::kComputeShard, shard, o.compute_dtype, tier, C::kParameters);
  } else if (!plan.compute_is_master) {
    add(UnitBuffer::kComputeFull, padded, o.compute_dtype, MemoryTier::kDevice, C::kParameters);
  }
  add(UnitBuffer::kFullGrad, padded, o.reduce_dtype, MemoryTier::kDevice, C::kGradients,
      o.stage <= ZeroStage::k1 ? Lifetime::kPersistent : Lifetime::kDuringBackward);
  if (plan.sharded_params && !plan.gathers_in_place) {
    add(UnitBuffer::kGathered, padded, o.compute_dtype, MemoryTier::kDevice, C::kGatheredWeights,
        plan.persistent ? Lifetime::kPersistent : Lifetime::kWhileGathered);
  }
  if (plan.sharded_params && !plan.persistent && o.hpz_partition_size > 1) {
    add(UnitBuffer::kSecondary, padded / o.hpz_partition_size, o.compute_dtype, MemoryTier::kDevice,
        C::kParameters);
  }
  return plan;
}

std::vector<PlannedBuffer> PlanRankBuffers(const ShardManagerOptions& o, int64_t numel,
                                           int data_ranks) {
  std::vector<PlannedBuffer> out;
  if (o.optimizer.kind != OptimizerKind::kOneBitLamb) return out;
  const int64_t padded = OneBitAllReduce::Padded(numel, data_ranks);
  const MemoryTier tier = o.placement.optimizer;
  out.push_back(
      {UnitBuffer::kFusedMomentum, padded, DType::kF32, tier, MemoryCategory::kOptimizerState});
  if (data_ranks > 1) {
    out.push_back(
        {UnitBuffer::kWorkerError, padded, DType::kF32, tier, MemoryCategory::kOptimizerState});
    out.push_back({UnitBuffer::kServerError, padded / data_ranks, DType::kF32, tier,
                   MemoryCategory::kOptimizerState});
  }
  return out;
}

}  // namespace zerort
