// ShardManager: the embedding API of zerort. A trainer that owns its forward/backward code
// registers its parameters in units, brackets each unit's forward and backward with a scope,
// and calls Step() once per optimizer step; the manager does the rest: ZeRO stage semantics,
// gathering and releasing with prefetch in recorded order, gradient reduction, loss scaling,
// clipping, the sharded optimizer, and offload of optimizer state and parameters to host memory
// or NVMe (options.placement). Public header: no CUDA, NCCL or MPI includes.
//
//   ZR_ASSIGN_OR_RETURN(auto manager, ShardManager::Create(options, resources));
//   ZR_ASSIGN_OR_RETURN(int fc1, manager->AddUnit("fc1", {{"fc1.weight", {64, 32}},
//                                                        {"fc1.bias", {64}, false}}));
//   ZR_RETURN_IF_ERROR(manager->Initialize(init));
//   for each step:
//     for each micro-batch:
//       { ZR_ASSIGN_OR_RETURN(UnitScope s, manager->ForwardScope(fc1));
//         read s.param(0), s.param(1); ZR_RETURN_IF_ERROR(s.End()); }
//       scale the loss's gradient by manager->loss_scale(), then, in reverse order:
//       { ZR_ASSIGN_OR_RETURN(UnitScope s, manager->BackwardScope(fc1));
//         add into s.grad(0), ...; ZR_RETURN_IF_ERROR(s.End()); }
//     ZR_ASSIGN_OR_RETURN(StepResult r, manager->Step({.lr = lr, .micro_batches = k}));
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/memory.h"
#include "zerort/sharding/gather_planner.h"
#include "zerort/sharding/gradient_reducer.h"
#include "zerort/sharding/loss_scaler.h"
#include "zerort/sharding/options.h"
#include "zerort/sharding/sharded_optimizer.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

class ShardManager;

// A unit in use for one forward or backward pass: gathered when created, released (and for a
// backward, its gradients reduced) by End(). End() is called by the destructor if the caller
// did not, and a failure there stops the program: call End() to handle errors yourself.
// The views param() and grad() return are the scope's to lend: after End() any access to their
// data fails at once naming the unit, the scope and the rank ([Note: view leases] in
// runtime/tensor.h), so a weight read from last step's view or a gradient written after the
// reduction is an error, not a silently wrong number.
class UnitScope {
 public:
  UnitScope(UnitScope&& other) noexcept;
  UnitScope& operator=(UnitScope&&) = delete;
  UnitScope(const UnitScope&) = delete;
  ~UnitScope();

  TensorView param(int i) const;  // compute dtype
  TensorView grad(int i) const;   // reduce dtype; backward scopes only; add (+=) into it
  Status End();

 private:
  friend class ShardManager;
  UnitScope(ShardManager* manager, int unit, bool backward, std::shared_ptr<ViewLease> lease)
      : manager_(manager), unit_(unit), backward_(backward), lease_(std::move(lease)) {}
  ShardManager* manager_;
  int unit_;
  bool backward_;
  std::shared_ptr<ViewLease> lease_;  // of every view handed out; revoked by End()
};

// How a unit takes part beyond its data-parallel group (AddUnit).
struct UnitOptions {
  // A unit held by several ranks of one model replica (the tied embedding on a pipeline's first
  // and last stage): after the data-parallel reduction its gradient shard is summed over
  // `tied` (every member holds the same unit, sharded alike, so the shards line up), and every
  // member then takes the same step. Needs the optimizer state in memory (not on NVMe).
  Communicator* tied = nullptr;
  // False on every member of `tied` but one, so that the model-parallel norm counts it once.
  bool counts_in_norm = true;
  // Step() fails when, since the last step, a unit had a Forward scope and no Backward scope
  // (its backward was skipped: it would get no gradient). False allows it, for a unit without
  // gradients (a frozen layer): its gradient is zero in such a step, and the optimizer still
  // updates it (weight decay, moments). A Backward scope alone is allowed: it may compute its
  // unit's forward too (recomputation, a fused output layer).
  bool needs_backward = true;
};

// Elements per parameter fetch buffer (offload_param nvme): offload_param.buffer_size at most,
// and no more than the largest compute shard that is fetched (`largest_offloaded_shard`, of the
// units that are not persistent; at least 1), so a small model does not reserve DeepSpeed's
// default of 5 x 1e8 elements of host staging.
int64_t ParamFetchBufferNumel(const ShardManagerOptions& options, int64_t largest_offloaded_shard);

struct StepInputs {
  float lr = 0.0f;
  int micro_batches = 1;  // gradients accumulated since the last step
};

struct StepResult {
  bool skipped = false;     // non-finite gradients on some rank: no parameter changed
  double grad_norm = 0.0;   // global L2 norm of the averaged, unscaled gradient, before clipping
  float loss_scale = 1.0f;  // the scale this step's gradients carried
  int64_t step = 0;         // optimizer steps taken so far (skipped ones excluded)
};

class ShardManager {
 public:
  struct Resources {
    // The ranks that shard the model state among themselves (required): the data-parallel
    // group, or with hybrid sharding ([Note: hybrid sharding], runtime/device_mesh.h) its shard
    // group.
    Communicator* dp = nullptr;
    // Hybrid sharding: the ranks that hold the same shards as this one (the replicate group);
    // each unit's reduced gradient shard is all-reduced over it after the reduction in `dp`.
    // Null, or a group of one: `dp` is the whole data-parallel group.
    Communicator* replicate = nullptr;
    // hpZ (options.hpz_partition_size h > 1, stage 3): groups of h consecutive ranks of `dp`
    // (within a node) that the secondary copy is sharded over ([Note: hpZ], sharded_unit.h).
    Communicator* secondary = nullptr;
    // qgZ (options.quantized_gradients): `dp`'s ranks on this node, and its ranks of this local
    // index on every node (null: one node); they must partition `dp` ([Note: qgZ]).
    Communicator* grad_intra = nullptr;
    Communicator* grad_inter = nullptr;
    // Required: memory where compute runs (GPU memory, or host memory on a CPU run: "device"
    // means the compute device, as in PyTorch, MemoryTier::kDevice alike); its tracker gets
    // every byte.
    Allocator* device_allocator = nullptr;
    Stream* compute = nullptr;  // optional: created on the allocator's device
    Stream* comm = nullptr;     // optional: created on the allocator's device
    // Offload tiers (options.placement not on the device): host memory for the host tier and
    // staging, created when null (pinned for kPinnedHost on CUDA); `tracker` accounts the host
    // and NVMe tiers (usually the device allocator's).
    Allocator* host_allocator = nullptr;
    MemoryTracker* tracker = nullptr;
    // With tensor (and pipeline) parallelism: the group of ranks that hold different parts of
    // one model replica (tensor x pipeline), over which the gradient norm and the overflow
    // decision are summed after the data-parallel reduction, and this rank's index in its
    // tensor-parallel group (parameters replicated across that group count on index 0 only).
    Communicator* model_parallel = nullptr;
    int tensor_parallel_rank = 0;
    // The tensor-parallel group itself (this rank's pipeline stage; null: none): LAMB's
    // per-parameter norms of split parameters are summed over it ([Note: LAMB with tensor
    // parallelism], sharding/lamb_step.cc). Required with LAMB at a tensor-parallel
    // rank above 0; when given, this rank's index in it must be tensor_parallel_rank.
    Communicator* tensor_parallel = nullptr;
    // Optional: the optimizer's work per unit, and the NVMe tier's reads per chunk, as spans
    // ("optimizer blocks.3" on the track of the tier's stream or "host", "nvme read blocks.3
    // [0, 65536)" on "io").
    SpanSink span;
  };

  static StatusOr<std::unique_ptr<ShardManager>> Create(const ShardManagerOptions& options,
                                                        const Resources& resources);
  ~ShardManager();

  // Registers a unit (before Initialize). Returns its index.
  StatusOr<int> AddUnit(std::string name, std::vector<ParamSpec> params,
                        const UnitOptions& unit_options = {});
  // Allocates and initialises every unit (collective over the data-parallel group).
  Status Initialize(const Initializer& init);

  // Open a scope on `unit` for its forward or its backward: gather it (waiting for a prefetch in
  // flight, issuing the next ones) and, for a backward, make its gradient buffer ready. They
  // compute nothing; the trainer's code runs inside the scope, and End() releases and reduces.
  StatusOr<UnitScope> ForwardScope(int unit);
  StatusOr<UnitScope> BackwardScope(int unit);
  // Completes this step's gradient reduction (stages 0-1 all-reduce here; 2-3 reduced as each
  // unit's backward ended, or here with options.reduce_at_step), then sums tied units'
  // gradient shards over their groups. Step() calls it when the caller has not; calling it first
  // lets a caller inspect the reduced gradient shards (optimizer().GradShard) before the update.
  Status ReduceGradients();
  StatusOr<StepResult> Step(const StepInputs& inputs);

  // The scale the backward multiplies the loss by (1 unless fp16 with loss scaling).
  float loss_scale() const { return scaler_.scale(); }
  int num_units() const { return static_cast<int>(units_.size()); }
  // A unit's name, layout, plan and state (its data only through scopes; ShardManagerState has
  // the internals for checkpoints and tests).
  const ShardedUnit& unit(int i) const { return *units_.at(i); }
  const UnitOptions& unit_options(int i) const { return unit_options_.at(i); }
  ShardedOptimizer& optimizer() { return *optimizer_; }
  // The NVMe store of this rank (null without an NVMe placement).
  const NvmeStore* nvme_store() const { return nvme_.get(); }
  const ShardManagerOptions& options() const { return options_; }
  Stream& compute_stream() { return *resources_.compute; }
  Allocator& device_allocator() { return *resources_.device_allocator; }
  // Bytes of gathered weights of non-persistent units currently gathered or gathering.
  int64_t live_gathered_bytes() const;
  // Gradient collectives issued so far (bucketing packs several units into one).
  int64_t gradient_collectives() const { return reducer_->collectives(); }
  // Where the offload tier's time went so far (cumulative seconds).
  const OffloadStats& offload_stats() const { return offload_stats_; }
  // Where the step's time went so far (cumulative wall seconds, wall_clock_breakdown).
  struct StepTimes {
    double gather_forward = 0;   // ForwardScope(): waiting for and issuing all-gathers
    double gather_backward = 0;  // BackwardScope(): the same, for the backward
    double reduce_backward = 0;  // reductions issued as units' backward ends (stages 2-3)
    double reduce_step = 0;      // ReduceGradients: the reductions left for the step
    double optimizer = 0;        // Step() without the reductions it completes
  };
  const StepTimes& step_times() const { return step_times_; }

 private:
  friend class UnitScope;
  friend class ShardManagerState;  // checkpoints' access: sharding/manager_state.h
  ShardManager(const ShardManagerOptions& options, const Resources& resources);
  Status EnsureGathered(int unit);
  StatusOr<StepResult> StepImpl(const StepInputs& inputs);
  Status Prefetch();
  GatherPlanner::Resident Resident() const;  // gathering or gathered
  Status CreateTiers();
  Status CreateParamStaging();
  std::vector<std::string> UnitEntries() const;
  Status AfterStep();  // zero the gradient shards, refresh the compute copies
  // A deferred step ([Note: the host step behind the forward]): completes the optimizer's update
  // of units settled_..`unit`, in order, and refreshes their compute copies (the refresh's
  // all-gathers at stages 1-2 and of persistent units are collectives: called at the same point
  // on every rank, first use of a unit or before the next step's reduction or a checkpoint).
  Status SettleThrough(int unit);
  Status SettleAll() { return SettleThrough(num_units() - 1); }
  Status RefreshComputeCopies();
  Status CheckNvmeSpace() const;
  Status PlaceOptimizerState();  // [Note: partial optimizer offload]
  Status EndScope(int unit, bool backward);
  // No unit had a Forward scope without a Backward since the last step
  // (UnitOptions::needs_backward); clears the record.
  Status CheckScopesPaired();
  StatusOr<UnitScope> OpenScope(int unit, bool backward);
  UnitResources UnitResourcesOf();

  ShardManagerOptions options_;
  Resources resources_;
  std::unique_ptr<Stream> owned_compute_;
  std::unique_ptr<Stream> owned_comm_;
  // [Note: gradient sums on the device]: the sums' copies to the host, off the compute stream.
  std::unique_ptr<Stream> owned_sums_;
  std::unique_ptr<Allocator> owned_host_;
  std::unique_ptr<Allocator> owned_staging_;  // pinned, when the host tier is not (CUDA)
  std::unique_ptr<NvmeStore> nvme_;
  // Fetches of offloaded compute shards: made by Initialize, sized to the units (units hold a
  // pointer to this pointer, as they are added before it exists).
  std::unique_ptr<StagingPool> param_staging_;
  Tiers tiers_;
  std::vector<std::unique_ptr<ShardedUnit>> units_;
  // Destroyed before the units: its step worker may be updating their compute copies ([Note: the
  // host step behind the forward]).
  std::unique_ptr<ShardedOptimizer> optimizer_;
  OffloadStats offload_stats_;
  StepTimes step_times_;
  std::vector<UnitOptions> unit_options_;  // one per unit
  // Per unit, the scopes opened since the last step: kForwardScope | kBackwardScope.
  std::vector<uint8_t> scopes_since_step_;
  // Per unit, its Forward and Backward scopes' description for their views' leases.
  std::vector<std::array<std::shared_ptr<const std::string>, 2>> scope_names_;
  std::unique_ptr<GradientReducer> reducer_;
  LossScaler scaler_;
  bool initialized_ = false;
  int64_t steps_ = 0;
  bool gradients_reduced_ = false;
  int settled_ = 0;  // units [0, settled_) hold the last step's values (all but in a deferred step)
  // The recorded gather order, prefetch and keep decisions ([Note: the gather plan]); made by
  // Initialize, when the units are known.
  std::unique_ptr<GatherPlanner> planner_;
};

}  // namespace zerort
