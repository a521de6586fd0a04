// ShardedUnit: one unit's flat layout, its buffers (see README.md, "Per-unit buffers") and its
// shard state machine. Only the unit's own methods change its state, and each checks its
// precondition with ZR_CHECK: a caller that gathers twice or reads a released unit is a bug that
// stops the program with the unit's name, not a silent corruption.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "sharding/flat_layout.h"
#include "sharding/options.h"

namespace zerort {

enum class ShardState { kSharded, kGathering, kUnsharded };
std::string_view ShardStateName(ShardState state);

// Fills one whole parameter (fp32, in its flattened row-major order). Called identically on every
// rank, so initial values do not depend on the world size or the stage.
using Initializer =
    std::function<void(const ParamSpec& spec, uint64_t seed, std::span<float> full)>;

// What a unit borrows from its manager.
struct UnitResources {
  const ShardManagerOptions* options = nullptr;
  Communicator* dp = nullptr;   // the data-parallel group
  Allocator* device = nullptr;  // device-tier memory
  Stream* compute = nullptr;    // where the model's kernels run
  Stream* comm = nullptr;       // all-gathers and reductions, to overlap with compute
};

// Per-step scalars of the optimizer.
struct OptimizerStepArgs {
  float lr = 0.0f;
  int64_t step = 1;         // 1-based count of steps taken (skipped ones excluded)
  float grad_scale = 1.0f;  // 1 / (loss scale x micro-batches) x clip coefficient
};

class ShardedUnit {
 public:
  static StatusOr<std::unique_ptr<ShardedUnit>> Create(std::string name,
                                                       std::vector<ParamSpec> params,
                                                       const UnitResources& resources);
  ~ShardedUnit();

  const std::string& name() const { return name_; }
  const FlatLayout& layout() const { return layout_; }
  ShardState state() const { return state_; }
  bool persistent() const { return persistent_; }
  int64_t gathered_bytes() const;  // padded_numel x compute dtype size

  // Allocates every buffer and fills the master shard and compute copies from `init`.
  Status Initialize(const Initializer& init);

  // SHARDED -> GATHERING: issues the all-gather of the compute shards on the comm stream.
  Status StartGather();
  // GATHERING -> UNSHARDED (the compute stream waits for the all-gather); no-op when UNSHARDED.
  Status FinishGather();
  // UNSHARDED -> SHARDED, returning the gathered buffer to the pool; no-op for persistent units.
  Status Release();

  // Compute-dtype view of parameter `i` (UNSHARDED only).
  TensorView Param(int i) const;
  // Reduce-dtype view of parameter i's full gradient (from BeginBackward until reduced).
  // Layers add (+=) their gradients into it.
  TensorView Grad(int i) const;
  Status BeginBackward();

  // The whole reduce-dtype gradient; GradientReducer reduces it over the data-parallel group.
  TensorView FullGrad() const;
  // Stages 2-3, after the reduction: frees the full gradient once `used_on` has finished.
  Status DropFullGrad(Stream& used_on);
  // Stages 0-1, after the all-reduce: this rank's slice becomes the fp32 gradient shard and the
  // full gradient is zeroed for the next step.
  Status TakeAllReducedGradient();

  // Step, in order (after GradientReducer::Finish): AccumulateNorm, OptimizerStep, AfterStep.
  // sum_sq += sum of squares of the gradient shard; nonfinite += count of inf/NaN in it.
  Status AccumulateNorm(const TensorView& sum_sq, const TensorView& nonfinite);
  Status OptimizerStep(const OptimizerStepArgs& args);
  // Zeroes gradients; stages 1-2 all-gather the updated compute parameters; stage-3 persistent
  // units re-gather theirs.
  Status AfterStep();

  // The full fp32 master value of parameter `i`, assembled from every rank's shard
  // (collective over the data-parallel group). For tests and checkpoints.
  Status GatherMaster(int i, std::span<float> out);
  // This rank's fp32 gradient shard and master shard (host or device views).
  TensorView GradShard() const;
  TensorView MasterShard() const;

  // The fp32 shard buffers a checkpoint holds. Optimizer states a run does not keep (Adam's
  // second moment under SGD, momentum under plain SGD) are absent.
  enum class StateBuffer { kMaster, kExpAvg, kExpAvgSq };
  bool HasState(StateBuffer kind) const;
  // This rank's shard of `kind` (shard_numel values, padding included) as host floats.
  StatusOr<std::vector<float>> ReadState(StateBuffer kind) const;
  // Overwrites this rank's shard of `kind`. Writing the master refreshes the compute copies
  // (cast, then all-gathered where the stage keeps full parameters): collective over the
  // data-parallel group; every unit must be SHARDED.
  Status WriteState(StateBuffer kind, std::span<const float> values);
  // This rank's index in the layout's frame: the data-parallel rank, or 0 at stage 0, where
  // every rank holds the whole (identical) state.
  int layout_rank() const { return rank_; }

 private:
  ShardedUnit(std::string name, FlatLayout layout, const UnitResources& resources);
  // Allocates a zeroed buffer on `tier` (the placement of that buffer kind).
  Status Allocate(Buffer* buffer, size_t bytes, MemoryCategory category, Stream* stream,
                  MemoryTier tier = MemoryTier::kDevice);
  TensorView ComputeFlat() const;  // the whole compute-dtype flat vector (full or gathered)
  bool sharded_params() const { return options().stage == ZeroStage::k3; }
  const ShardManagerOptions& options() const { return *resources_.options; }
  Device device() const { return resources_.device->device(); }

  std::string name_;
  FlatLayout layout_;
  UnitResources resources_;
  int rank_ = 0;  // in the layout's frame (0 at stage 0, which does not shard)
  ShardState state_ = ShardState::kSharded;
  bool persistent_ = false;
  bool initialized_ = false;

  Buffer master_;         // fp32, shard
  Buffer exp_avg_;        // fp32, shard (Adam) or momentum (SGD)
  Buffer exp_avg_sq_;     // fp32, shard (Adam)
  Buffer compute_shard_;  // compute dtype, shard (stage 3)
  Buffer compute_full_;   // compute dtype, padded (stages 0-2; unused at stage 0 in fp32)
  Buffer gathered_;       // compute dtype, padded (stage 3, while GATHERING/UNSHARDED)
  Buffer full_grad_;      // reduce dtype, padded
  Buffer grad_shard_;     // fp32, shard
  std::unique_ptr<Event> gathered_event_;  // end of the all-gather on the comm stream
};

}  // namespace zerort
