// UnitPlan: the buffers one unit keeps for a ZeRO stage, dtypes and placement — element count,
// dtype, tier, category and lifetime of each — as a pure function of the options and the unit's
// FlatLayout. ShardedUnit (parameter side) and ShardedOptimizer (optimizer side) allocate from
// it, in its order; the memory model (estimate/step_model.cc) replays the same plan, so the
// runtime and the estimate cannot disagree about what a stage keeps where.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "zerort/runtime/dtype.h"
#include "zerort/runtime/memory.h"
#include "zerort/sharding/flat_layout.h"
#include "zerort/sharding/options.h"

namespace zerort {

enum class UnitBuffer : uint8_t {
  kMaster,         // fp32 shard the optimizer updates
  kExpAvg,         // Adam's first moment, or SGD's momentum
  kExpAvgSq,       // Adam's second moment
  kGradShard,      // fp32 reduced gradient shard, accumulated over micro-batches
  kComputeShard,   // stage 3: the master shard in compute dtype (the all-gather's input)
  kComputeFull,    // stages 0-2: the whole flat vector in compute dtype, always resident
  kGathered,       // stage 3: the whole flat vector in compute dtype while gathered
  kFullGrad,       // the unit's gradient in reduce dtype (persistent at 0-1, per backward at 2-3)
  kSecondary,      // stage 3 with hpZ: this rank's 1/hpz of the flat vector ([Note: hpZ])
  kWorkerError,    // 1-bit Adam: this rank's compression error, each parameter padded
  kServerError,    // 1-bit Adam: its server chunk's error ([Note: 1-bit Adam])
  kAccumulator,    // 0/1 Adam: the local steps summed since the last synchronisation
  kExpAvgSqFresh,  // 1-bit LAMB: the second moment kept fresh after freeze_step
  kFusedMomentum,  // 1-bit LAMB: a rank's whole momentum, padded (one per rank, not per unit)
};
std::string_view UnitBufferName(UnitBuffer buffer);  // "master", "exp_avg", ...

enum class Lifetime : uint8_t {
  kPersistent,      // from Initialize to the end of the run
  kWhileGathered,   // from StartGather to Release
  kDuringBackward,  // from the unit's backward until its gradient is reduced
};

struct PlannedBuffer {
  UnitBuffer buffer;
  int64_t numel = 0;
  DType dtype = DType::kF32;
  MemoryTier tier = MemoryTier::kDevice;
  MemoryCategory category = MemoryCategory::kParameters;
  Lifetime lifetime = Lifetime::kPersistent;
  int64_t bytes() const { return numel * static_cast<int64_t>(DTypeSize(dtype)); }
};

// How the data-parallel group divides a unit, by stage.
enum class Partitioning : uint8_t {
  kReplicated,  // stage 0: one "shard" is the whole flat vector, held identically by every rank
  kSharded,     // stages 1-3: dp_size shards, rank r owns shard r
};

struct UnitPlan {
  Partitioning partitioning = Partitioning::kReplicated;
  bool sharded_params = false;  // stage 3: parameters exist only as shards between gathers
  bool persistent = false;      // gathered once and kept (stages 0-2, small stage-3 units)
  // Stage 3 with one shard rank: the compute shard is the whole flat vector, on the device, and
  // is read in place; no gathered buffer, no gather, nothing to free ([Note: one shard rank]).
  bool gathers_in_place = false;
  // Stage 0 in fp32: the compute copy would equal the master, so the model reads the master.
  bool compute_is_master = false;
  std::vector<PlannedBuffer> buffers;  // in allocation order

  const PlannedBuffer* Find(UnitBuffer buffer) const;
  bool Has(UnitBuffer buffer) const { return Find(buffer) != nullptr; }
};

// Shards of a unit's flat vector: 1 at stage 0 (replicated), else the data-parallel size.
int ShardCount(ZeroStage stage, int dp_size);
// DeepSpeed's 1-bit optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB): their compressed all-reduce.
inline bool IsOneBit(OptimizerKind kind) {
  return kind == OptimizerKind::kOneBitAdam || kind == OptimizerKind::kZeroOneAdam ||
         kind == OptimizerKind::kOneBitLamb;
}
// fp32 moments the optimizer keeps per element: Adam(W) 2, SGD with momentum 1, plain SGD 0.
int OptimizerStateCount(const OptimizerOptions& optimizer);
// The plan of a unit laid out by `layout` (whose dp_size is ShardCount(stage, dp)), for a
// data-parallel group of `data_ranks` (the 1-bit optimizers' error buffers depend on it), its
// optimizer state on `optimizer_tier` (UnitOptimizerTier: [Note: partial optimizer offload]).
UnitPlan PlanUnit(const ShardManagerOptions& options, const FlatLayout& layout, int data_ranks,
                  MemoryTier optimizer_tier);
// Whether a stage-3 unit reads its compute shard in place ([Note: one shard rank]).
bool GathersInPlace(const ShardManagerOptions& options, const FlatLayout& layout, int data_ranks);
// 1-bit LAMB's buffers of one rank, after its units' ([Note: 1-bit LAMB]): the fused momentum of
// `numel` elements (the parameters of every unit of the rank) padded for `data_ranks`, and with
// more than one rank the worker error (as long) and the server error (1/data_ranks of it). Empty
// for every other optimizer.
std::vector<PlannedBuffer> PlanRankBuffers(const ShardManagerOptions& options, int64_t numel,
                                           int data_ranks);

}  // namespace zerort
