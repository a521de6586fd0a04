// A ShardManager's state for checkpoints and inspection (manager_state.h).
#include "zerort/sharding/manager_state.h"

#include <algorithm>
#include <vector>

#include "zerort/runtime/strings.h"

namespace zerort {

Status ShardManagerState::RefreshComputeCopies() {
  ZR_RETURN_IF_ERROR(m_.SettleAll());  // a deferred step's units, before they are refreshed again
  ZR_RETURN_IF_ERROR(m_.optimizer_->ResetCompressionErrors());
  return m_.RefreshComputeCopies();
}

Status ShardManagerState::ReadState(int u, StateKind kind, std::span<float> out) {
  return m_.optimizer_->ReadState(u, kind, out);
}

Status ShardManagerState::LoadState(int u, StateKind kind, std::span<const float> values) {
  ShardedUnit& unit = *m_.units_.at(u);
  ZR_CHECK(unit.state() == ShardState::kSharded || unit.persistent())
      << "LoadState while unit '" << unit.name() << "' is " << ShardStateName(unit.state());
  ZR_RETURN_IF_ERROR(m_.optimizer_->WriteState(u, kind, values));
  if (kind != StateKind::kMaster) return absl::OkStatus();
  const TensorView master(const_cast<float*>(values.data()), DType::kF32,
                          {static_cast<int64_t>(values.size())}, Device::Cpu());
  return unit.SetComputeFromMaster(master);
}

Status ShardManagerState::GatherMaster(int u, int param, std::span<float> out) {
  ShardedUnit& unit = *m_.units_.at(u);
  const FlatLayout& layout = unit.layout();
  const ParamSpec& spec = layout.params().at(param);
  if (static_cast<int64_t>(out.size()) != spec.numel()) {
    return absl::InvalidArgumentError(StrCat("GatherMaster of '", spec.name, "' into ", out.size(),
                                             " elements, expected ", spec.numel()));
  }
  // Gathered through device memory on the compute stream (any backend, NCCL included).
  const int64_t shard = layout.shard_numel();
  std::vector<float> own(static_cast<size_t>(shard));
  ZR_RETURN_IF_ERROR(m_.optimizer_->ReadState(u, StateKind::kMaster, own));
  std::vector<float> full(static_cast<size_t>(layout.padded_numel()));
  Stream& compute = *m_.resources_.compute;
  const Device device = m_.tiers_.device->device();
  if (layout.dp_size() > 1) {
    ZR_ASSIGN_OR_RETURN(
        Buffer mine, m_.tiers_.device->Allocate(shard * 4, MemoryCategory::kWorkspace, &compute));
    ZR_ASSIGN_OR_RETURN(Buffer all, m_.tiers_.device->Allocate(
                                        full.size() * 4, MemoryCategory::kWorkspace, &compute));
    ZR_RETURN_IF_ERROR(
        CopyBytes(mine.data(), device, own.data(), Device::Cpu(), shard * 4, &compute));
    ZR_RETURN_IF_ERROR(
        m_.resources_.dp->AllGather(mine.data(), all.data(), shard, DType::kF32, &compute));
    ZR_RETURN_IF_ERROR(
        CopyBytes(full.data(), Device::Cpu(), all.data(), device, full.size() * 4, &compute));
    ZR_RETURN_IF_ERROR(compute.Synchronize());
  } else {
    full = std::move(own);
  }
  const Range flat = layout.flat_range(param);
  std::copy(full.begin() + flat.begin, full.begin() + flat.end, out.begin());
  return absl::OkStatus();
}

Status ShardManagerState::RestoreCounters(int64_t steps, const LossScaler::State& scaler) {
  if (!m_.initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (steps < 0) return absl::InvalidArgumentError(StrCat("step count ", steps, " is negative"));
  m_.steps_ = steps;
  m_.optimizer_->RestoreSchedule(steps);
  m_.scaler_.Restore(scaler);
  return absl::OkStatus();
}

}  // namespace zerort
