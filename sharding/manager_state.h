// ShardManagerState: a ShardManager's state as a checkpoint sees it, apart from the training
// interface (ShardManager keeps gathering, reducing and stepping): the counters (optimizer steps,
// skipped steps, the loss scaler) and each unit's shards of every StateKind, read and loaded one
// unit at a time; and, for tests and inspection, a parameter's full fp32 master assembled from
// every rank's shard. A view: construct it where needed,
// `ShardManagerState(manager).ReadState(..)`.
#pragma once

#include <cstdint>
#include <span>

#include "zerort/sharding/shard_manager.h"

namespace zerort {

class ShardManagerState {
 public:
  explicit ShardManagerState(ShardManager& manager) : m_(manager) {}

  // The data-parallel group the manager shards over (the checkpoint's world without model
  // parallelism).
  Communicator& dp() const { return *m_.resources_.dp; }
  // Optimizer steps taken (skipped ones excluded), steps skipped on overflow, the loss scaler.
  int64_t steps() const { return m_.steps_; }
  int64_t skipped_steps() const { return m_.scaler_.skipped_steps(); }
  LossScaler::State scaler_state() const { return m_.scaler_.state(); }
  // Restores the steps and the scaler (after the units' state was loaded with LoadState).
  Status RestoreCounters(int64_t steps, const LossScaler::State& scaler);
  // This rank's shard of `kind` of unit `u`. LoadState of the master also sets the unit's compute
  // values; after loading every unit, RefreshComputeCopies (collective) all-gathers them where the
  // stage keeps full parameters, and zeroes 1-bit Adam's compression errors (as DeepSpeed resets
  // them on a load: [Note: 1-bit Adam]).
  Status ReadState(int u, StateKind kind, std::span<float> out);
  Status LoadState(int u, StateKind kind, std::span<const float> values);
  Status RefreshComputeCopies();
  // The unit's internals (its buffers and state transitions, around the scopes): for checkpoints
  // and tests of the unit's state machine, not for training code.
  ShardedUnit& unit(int u) { return *m_.units_.at(u); }
  // The full fp32 master value of parameter `param` of unit `u`, assembled from every rank's
  // shard (collective over the data-parallel group).
  Status GatherMaster(int u, int param, std::span<float> out);

 private:
  ShardManager& m_;
};

}  // namespace zerort
