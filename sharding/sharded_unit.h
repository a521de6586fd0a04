// ShardedUnit: the parameter side of one unit — its flat layout and plan, the compute copies of
// its parameters (compute shard, full parameters or gathered buffer), its shard state machine,
// and its full gradient (`grad()`, a UnitGradient). The optimizer side (master, moments, gradient
// shard) is ShardedOptimizer's. Only the unit's own methods change its state, and each checks its
// precondition with ZR_CHECK: a caller that gathers twice or reads a released unit is a bug that
// stops the program with the unit's name, not a silent corruption.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerort/offload/staging_pool.h"
#include "zerort/runtime/communicator.h"
#include "zerort/sharding/placed_buffer.h"
#include "zerort/sharding/unit_gradient.h"

namespace zerort {

// FETCHING exists only for units whose compute shard is offloaded (offload_param): the shard is
// on its way from host memory or NVMe into a staging buffer the all-gather reads.
enum class ShardState { kSharded, kFetching, kGathering, kUnsharded };
std::string_view ShardStateName(ShardState state);

// Fills one whole parameter (fp32, in its flattened row-major order). Called identically on every
// rank, so initial values do not depend on the world size or the stage.
using Initializer =
    std::function<void(const ParamSpec& spec, uint64_t seed, std::span<float> full)>;

// Where the offload tier's time goes (seconds, cumulative; the trainer reports per-step deltas).
struct OffloadStats {
  double fetch_wait_s = 0;         // waiting for parameter shards to arrive from NVMe
  double grad_io_s = 0;            // writing (and re-reading) NVMe gradient shards in the backward
  double optimizer_s = 0;          // the whole optimizer step on the host or NVMe tier
  double optimizer_io_wait_s = 0;  // of which: waiting for NVMe reads and staging sets
  // The backward's host-tier gradients ([Note: host gradients in flight]): the host that issues
  // the kernels waiting for them (a full queue; their drain before the norm and the step), and
  // the queue's worker adding them into the host shards (memory or NVMe), overlapped.
  double grad_wait_s = 0;
  double grad_add_s = 0;
  // A deferred host step ([Note: the host step behind the forward]): the host that issues the
  // kernels waiting for a unit's update (optimizer_s counts the worker's update time).
  double update_wait_s = 0;
  // In-memory host-tier gradient shards the norm read again because their last add did not take
  // their sum of squares ([Note: the norm taken by the last add]): a count, not seconds.
  int64_t norm_passes = 0;
};
// Field by field: a step's share of cumulative stats.
inline OffloadStats operator-(const OffloadStats& a, const OffloadStats& b) {
  return {a.fetch_wait_s - b.fetch_wait_s,   a.grad_io_s - b.grad_io_s,
          a.optimizer_s - b.optimizer_s,     a.optimizer_io_wait_s - b.optimizer_io_wait_s,
          a.grad_wait_s - b.grad_wait_s,     a.grad_add_s - b.grad_add_s,
          a.update_wait_s - b.update_wait_s, a.norm_passes - b.norm_passes};
}

// What a unit borrows from its manager.
struct UnitResources {
  const ShardManagerOptions* options = nullptr;
  Communicator* dp = nullptr;  // the ranks that shard the state (the data-parallel group)
  Tiers tiers;                 // device memory, and the offload tiers in use
  Stream* compute = nullptr;   // where the model's kernels run
  Stream* comm = nullptr;      // all-gathers and reductions, to overlap with compute
  // Fetches of offloaded compute shards: the manager's pool, made once every unit is added.
  const std::unique_ptr<StagingPool>* param_staging = nullptr;
  OffloadStats* stats = nullptr;  // the manager's; null: not counted
  // Hybrid sharding: the ranks holding the same shards (ShardManager::Resources::replicate).
  Communicator* replicate = nullptr;
  // hpZ: the group the secondary copy is sharded over (ShardManager::Resources::secondary).
  Communicator* secondary = nullptr;
  // qgZ: the two levels of the quantized reduce-scatter (Resources::grad_intra, grad_inter).
  Communicator* grad_intra = nullptr;
  Communicator* grad_inter = nullptr;
};

// [Note: hpZ]
// ZeRO++'s hierarchical partitioning (DeepSpeed's zero_hpz_partition_size h), stage 3: the first
// gather of a non-persistent unit after a step (its forward's) all-gathers the primary shards
// over the data-parallel (shard) group as always, and also copies this rank's 1/h of the gathered
// flat vector into the unit's secondary buffer (UnitPlan's kSecondary: padded / h elements,
// resident), indexed by its rank in the secondary group (h consecutive ranks of the shard group,
// within a node). Every later gather of the step (the backward's, a reused unit's, the next
// micro-batch's) all-gathers those secondary pieces over the secondary group instead: the same
// bytes in the same order, so the weights are bitwise the primary gather's, and the gathers
// stay inside the node. The step changes the weights: RefreshAfterStep, which ends every step and
// every checkpoint load (ShardManagerState::RefreshComputeCopies), marks the copy stale, and the
// next gather is a primary one again. An offloaded compute shard is not fetched while the copy is
// valid. Costs padded / h compute elements per unit of device memory, as DeepSpeed's secondary
// tensor does.

// Where the optimizer writes this rank's updated compute values: shard element i goes to element
// `offset + i` of `buffer`. A null buffer: the model reads the master itself (stage 0, fp32).
struct ComputeCopy {
  PlacedBuffer* buffer = nullptr;
  int64_t offset = 0;
};

class ShardedUnit {
 public:
  // `optimizer_tier`: where the optimizer's buffers of its plan go (UnitOptimizerTier).
  static StatusOr<std::unique_ptr<ShardedUnit>> Create(std::string name,
                                                       std::vector<ParamSpec> params,
                                                       const UnitResources& resources,
                                                       MemoryTier optimizer_tier);
  ~ShardedUnit();

  const std::string& name() const { return name_; }
  const FlatLayout& layout() const { return layout_; }
  const UnitPlan& plan() const { return plan_; }
  ShardState state() const { return state_; }
  bool persistent() const { return plan_.persistent; }
  int64_t gathered_bytes() const;  // padded_numel x compute dtype size
  // This rank's index in the layout's frame: the data-parallel rank, or 0 when replicated.
  int layout_rank() const { return rank_; }

  // Allocates the parameter-side buffers and sets the compute copies from this rank's fp32
  // master shard `master` (any device; `master_storage` aliases it at stage 0 in fp32).
  Status Initialize(const TensorView& master);

  // SHARDED -> FETCHING: starts reading an offloaded compute shard; no-op otherwise (and while
  // the hpZ copy is valid: the gather reads that).
  Status StartFetch();
  // FETCHING -> SHARDED: a fetch that will not be used this step (the model changed its order)
  // waits for its read and gives its buffer back; no-op in any other state.
  Status CancelFetch();
  // SHARDED/FETCHING -> GATHERING: issues the all-gather of the compute shards on the comm stream.
  Status StartGather();
  // GATHERING -> UNSHARDED (the compute stream waits for the all-gather); no-op when UNSHARDED.
  Status FinishGather();
  // UNSHARDED -> SHARDED, returning the gathered buffer to the pool (filled with NaN first under
  // options.poison_released); no-op for persistent units.
  Status Release();

  // Compute-dtype view of parameter `i` (UNSHARDED only).
  TensorView Param(int i);
  // The reduce-dtype full gradient: layers add into grad().Param(i) from BeginBackward on,
  // GradientReducer reduces grad().Full() over the data-parallel group, then drops it (stages
  // 2-3) or zeroes it (stages 0-1) once the step took this rank's slice.
  UnitGradient& grad() { return grad_; }

  ComputeCopy compute_copy();
  // Sets this rank's compute values from fp32 master values (a loaded checkpoint); local, the
  // all-gathers follow in RefreshAfterStep.
  Status SetComputeFromMaster(const TensorView& master);
  // After the optimizer wrote this rank's compute values: stages 1-2 all-gather the full
  // parameters; persistent stage-3 units re-gather theirs.
  Status RefreshAfterStep();

 private:
  // Every rank's shard of `shard` elements into `all` (rank-major): one all-gather, or, with
  // DeepSpeed's allgather_partitions false, one broadcast per rank (the same bytes).
  Status GatherShards(Communicator& group, const void* mine, void* all, int64_t shard,
                      Stream* stream);
  // [Note: hpZ]: the gather from the secondary pieces; the copy of this rank's piece.
  Status GatherSecondary();
  Status GatherQuantized(const void* shard, Stream* comm);  // qwZ
  Status KeepSecondary(Stream* comm);
  // Stages 1-2: the full compute parameters from every rank's shard of them, in collectives of
  // at most allgather_bucket_size elements.
  Status GatherUpdated(Stream* stream);
  ShardedUnit(std::string name, FlatLayout layout, const UnitResources& resources,
              MemoryTier optimizer_tier);
  Status Allocate(PlacedBuffer* buffer, UnitBuffer which);
  Status Fail(const Status& status) const;  // annotates with the unit's name
  TensorView ComputeFlat() const;  // the whole compute-dtype flat vector (full or gathered)
  const ShardManagerOptions& options() const { return *resources_.options; }
  Device device() const { return resources_.tiers.device->device(); }

  std::string name_;
  FlatLayout layout_;
  UnitPlan plan_;
  UnitResources resources_;
  int rank_ = 0;  // in the layout's frame (0 when replicated)
  ShardState state_ = ShardState::kSharded;
  bool initialized_ = false;

  TensorView master_alias_;      // stage 0 in fp32: the model reads the master
  PlacedBuffer compute_shard_;   // compute dtype, shard (stage 3; offload_param places it)
  PlacedBuffer compute_full_;    // compute dtype, padded (stages 0-2)
  Buffer gathered_;              // compute dtype, padded (stage 3, while GATHERING/UNSHARDED)
  std::deque<Buffer> poisoned_;  // poison_released: the last released ones ([Note: poisoned
                                 // buffers], sharded_unit.cc)
  void TrimPoisoned();
  UnitGradient grad_;             // reduce dtype, padded
  PlacedBuffer secondary_;        // [Note: hpZ]: compute dtype, padded / hpz_partition_size
  bool secondary_valid_ = false;  // holds this step's weights
  std::unique_ptr<Event> gathered_event_;  // end of the all-gather on the comm stream
  // The compute shard's last write on the compute stream (the optimizer step or a checkpoint
  // load, recorded by RefreshAfterStep): a gather waits for it, and for nothing else of the
  // compute stream, so that a prefetched gather overlaps the kernels issued before it.
  std::unique_ptr<Event> written_event_;
  // An offloaded compute shard on its way: the staging lease, the NVMe read (if any).
  StagingPool::Lease fetch_lease_;
  IoHandle fetch_io_;
};

}  // namespace zerort
