// ShardManager: scopes, prefetch in recorded order within the live-bytes budget, and the step.
#include "sharding/shard_manager.h"

#include <cmath>

#include "runtime/log.h"
#include "runtime/strings.h"

namespace zerort {

// ---------------------------------------------------------------- UnitScope

UnitScope::UnitScope(UnitScope&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      unit_(other.unit_),
      backward_(other.backward_) {}

UnitScope::~UnitScope() {
  if (manager_ != nullptr) ZR_CHECK_OK(End());
}

TensorView UnitScope::param(int i) const {
  ZR_CHECK(manager_ != nullptr) << "param() of an ended scope";
  return manager_->unit(unit_).Param(i);
}

TensorView UnitScope::grad(int i) const {
  ZR_CHECK(manager_ != nullptr && backward_) << "grad() outside a backward scope";
  return manager_->unit(unit_).Grad(i);
}

Status UnitScope::End() {
  if (manager_ == nullptr) return absl::OkStatus();
  ShardManager* manager = std::exchange(manager_, nullptr);
  return manager->EndScope(unit_, backward_);
}

// ---------------------------------------------------------------- ShardManager

ShardManager::ShardManager(const ShardManagerOptions& options, const Resources& resources)
    : options_(options),
      resources_(resources),
      scaler_(options.loss_scale, options.compute_dtype == DType::kF16) {}

ShardManager::~ShardManager() = default;

StatusOr<std::unique_ptr<ShardManager>> ShardManager::Create(const ShardManagerOptions& options,
                                                             const Resources& resources) {
  if (resources.dp == nullptr || resources.device_allocator == nullptr) {
    return absl::InvalidArgumentError(
        "ShardManager needs a data-parallel group and a device allocator");
  }
  if (!IsFloatingPoint(options.compute_dtype) || !IsFloatingPoint(options.reduce_dtype)) {
    return absl::InvalidArgumentError("compute and reduce dtypes must be f32, bf16 or f16");
  }
  for (auto [tier, key] :
       {std::pair{options.placement.master, "offload_optimizer (master weights)"},
        std::pair{options.placement.optimizer_state, "offload_optimizer"},
        std::pair{options.placement.compute_shard, "offload_param"}}) {
    if (tier != MemoryTier::kDevice) {
      return absl::UnimplementedError(
          StrCat(key, " to the ", MemoryTierName(tier),
                 " tier is not available yet: only device placement is"));
    }
  }
  if (options.gradient_clipping < 0) {
    return absl::InvalidArgumentError(
        StrCat("gradient_clipping ", options.gradient_clipping, " is negative"));
  }
  std::unique_ptr<ShardManager> m(new ShardManager(options, resources));
  const Device device = resources.device_allocator->device();
  if (m->resources_.compute == nullptr) {
    ZR_ASSIGN_OR_RETURN(m->owned_compute_, CreateStream(device, "compute"));
    m->resources_.compute = m->owned_compute_.get();
  }
  if (m->resources_.comm == nullptr) {
    // Exists to overlap all-gathers and reduce-scatters with the compute stream's kernels.
    ZR_ASSIGN_OR_RETURN(m->owned_comm_, CreateStream(device, "comm"));
    m->resources_.comm = m->owned_comm_.get();
  }
  m->reducer_ = std::make_unique<GradientReducer>(m->UnitResourcesOf());
  return m;
}

UnitResources ShardManager::UnitResourcesOf() const {
  return UnitResources{&options_, resources_.dp, resources_.device_allocator, resources_.compute,
                       resources_.comm};
}

StatusOr<int> ShardManager::AddUnit(std::string name, std::vector<ParamSpec> params) {
  if (initialized_)
    return absl::FailedPreconditionError(StrCat("unit '", name, "' added after Initialize"));
  for (const auto& u : units_) {
    if (u->name() == name)
      return absl::InvalidArgumentError(StrCat("unit '", name, "' added twice"));
  }
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<ShardedUnit> unit,
                      ShardedUnit::Create(std::move(name), std::move(params), UnitResourcesOf()));
  units_.push_back(std::move(unit));
  return static_cast<int>(units_.size() - 1);
}

Status ShardManager::Initialize(const Initializer& init) {
  if (initialized_) return absl::FailedPreconditionError("Initialize called twice");
  if (units_.empty()) return absl::FailedPreconditionError("no units were added");
  for (auto& u : units_) ZR_RETURN_IF_ERROR(u->Initialize(init));
  ZR_RETURN_IF_ERROR(resources_.compute->Synchronize());
  initialized_ = true;
  return absl::OkStatus();
}

Status ShardManager::RestoreCounters(int64_t steps, const LossScaler::State& scaler) {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (steps < 0) return absl::InvalidArgumentError(StrCat("step count ", steps, " is negative"));
  steps_ = steps;
  scaler_.Restore(scaler);
  return absl::OkStatus();
}

int64_t ShardManager::live_gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_) {
    if (!u->persistent() && u->state() != ShardState::kSharded) bytes += u->gathered_bytes();
  }
  return bytes;
}

Status ShardManager::Prefetch(int after_position) {
  // Issue the next units of the recorded order while both budgets allow (in bytes of the
  // compute dtype, as DeepSpeed counts these knobs in elements).
  const int64_t elem = static_cast<int64_t>(DTypeSize(options_.compute_dtype));
  const int64_t live_budget = options_.stage3_max_live_parameters * elem;
  const int64_t ahead_budget = options_.stage3_prefetch_bucket_size * elem;
  int64_t ahead = 0;
  for (size_t i = static_cast<size_t>(after_position) + 1; i < recorded_order_.size(); ++i) {
    ShardedUnit& u = *units_[recorded_order_[i]];
    if (u.persistent() || u.state() != ShardState::kSharded) continue;
    if (ahead + u.gathered_bytes() > ahead_budget ||
        live_gathered_bytes() + u.gathered_bytes() > live_budget) {
      break;
    }
    ZR_RETURN_IF_ERROR(u.StartGather());
    ahead += u.gathered_bytes();
  }
  return absl::OkStatus();
}

Status ShardManager::EnsureGathered(int unit) {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (unit < 0 || unit >= num_units()) {
    return absl::InvalidArgumentError(
        StrCat("unit index ", unit, " out of range (", num_units(), " units)"));
  }
  ShardedUnit& u = *units_[unit];
  if (recording_) {
    recorded_order_.push_back(unit);
  } else if (!order_changed_ &&
             (position_ >= recorded_order_.size() || recorded_order_[position_] != unit)) {
    // The model changed its order (a branch, say): no more prefetch this step; re-record next.
    Logger()->debug("unit order changed at position {}; prefetch re-records next step", position_);
    order_changed_ = true;
  }
  if (!u.persistent() && u.state() == ShardState::kSharded) ZR_RETURN_IF_ERROR(u.StartGather());
  ZR_RETURN_IF_ERROR(u.FinishGather());
  if (!recording_ && !order_changed_) ZR_RETURN_IF_ERROR(Prefetch(static_cast<int>(position_)));
  ++position_;
  return absl::OkStatus();
}

StatusOr<UnitScope> ShardManager::Forward(int unit) {
  ZR_RETURN_IF_ERROR(EnsureGathered(unit));
  return UnitScope(this, unit, false);
}

StatusOr<UnitScope> ShardManager::Backward(int unit) {
  ZR_RETURN_IF_ERROR(EnsureGathered(unit));
  ZR_RETURN_IF_ERROR(units_[unit]->BeginBackward());
  return UnitScope(this, unit, true);
}

void ShardManager::EndStepOrder() {
  // The first step records the order; later steps replay it, unless the order changed.
  if (order_changed_) {
    recorded_order_.clear();
    recording_ = true;
    order_changed_ = false;
  } else {
    recording_ = false;
  }
  position_ = 0;
}

Status ShardManager::EndScope(int unit, bool backward) {
  ShardedUnit& u = *units_[unit];
  if (backward && (options_.stage == ZeroStage::k2 || options_.stage == ZeroStage::k3)) {
    ZR_RETURN_IF_ERROR(reducer_->Add(u));
  }
  return u.Release();
}

Status ShardManager::ReduceGradients() {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (gradients_reduced_) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(reducer_->Finish(units_));
  gradients_reduced_ = true;
  return absl::OkStatus();
}

StatusOr<StepResult> ShardManager::Step(const StepInputs& inputs) {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (inputs.micro_batches < 1) {
    return absl::InvalidArgumentError(
        StrCat("micro_batches ", inputs.micro_batches, " is below 1"));
  }
  if (!(inputs.lr >= 0))
    return absl::InvalidArgumentError(StrCat("learning rate ", inputs.lr, " is negative"));
  for (auto& u : units_) {
    if (!u->persistent() && u->state() != ShardState::kSharded) {
      return absl::FailedPreconditionError(StrCat("Step while unit '", u->name(), "' is ",
                                                  ShardStateName(u->state()),
                                                  "; end its scope first"));
    }
  }
  Stream& compute = *resources_.compute;
  const Device device = resources_.device_allocator->device();
  ZR_RETURN_IF_ERROR(ReduceGradients());
  gradients_reduced_ = false;

  // Sum of squares and non-finite count of every gradient shard, then one all-reduce.
  ZR_ASSIGN_OR_RETURN(Buffer acc, resources_.device_allocator->Allocate(
                                      2 * sizeof(float), MemoryCategory::kWorkspace, &compute));
  ZR_RETURN_IF_ERROR(FillZero(acc.data(), device, acc.bytes(), &compute));
  const TensorView sum_sq(acc.data(), DType::kF32, {1}, device);
  const TensorView nonfinite(static_cast<float*>(acc.data()) + 1, DType::kF32, {1}, device);
  for (auto& u : units_) ZR_RETURN_IF_ERROR(u->AccumulateNorm(sum_sq, nonfinite));
  // On the device buffer and the compute stream, so that an NCCL group works as well as MPI.
  // Stage 0 holds the whole, identical gradient on every rank: its sums are already global.
  if (options_.stage != ZeroStage::k0) {
    ZR_RETURN_IF_ERROR(
        resources_.dp->AllReduce(acc.data(), acc.data(), 2, DType::kF32, ReduceOp::kSum, &compute));
  }
  float host[2] = {0, 0};
  ZR_RETURN_IF_ERROR(CopyBytes(host, Device::Cpu(), acc.data(), device, sizeof(host), &compute));
  ZR_RETURN_IF_ERROR(compute.Synchronize());
  // Every rank saw the same sums, so every rank takes the same decision.
  const bool overflow = host[1] > 0 || !std::isfinite(host[0]);
  const float loss_scale = scaler_.scale();
  const double unscale = 1.0 / (static_cast<double>(loss_scale) * inputs.micro_batches);
  StepResult result;
  result.loss_scale = loss_scale;
  result.grad_norm = std::sqrt(static_cast<double>(host[0])) * unscale;
  if (overflow) {
    result.skipped = true;
    for (auto& u : units_) ZR_RETURN_IF_ERROR(u->AfterStep());
    ZR_RETURN_IF_ERROR(scaler_.Update(true));
    Logger()->warn("step {} skipped: non-finite gradients (loss scale {} -> {})", steps_ + 1,
                   loss_scale, scaler_.scale());
    EndStepOrder();
    result.step = steps_;
    return result;
  }
  double clip = 1.0;
  if (options_.gradient_clipping > 0) {
    // As DeepSpeed and torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1.
    clip = std::min(1.0, options_.gradient_clipping / (result.grad_norm + 1e-6));
  }
  ++steps_;
  const OptimizerStepArgs args{inputs.lr, steps_, static_cast<float>(unscale * clip)};
  for (auto& u : units_) ZR_RETURN_IF_ERROR(u->OptimizerStep(args));
  for (auto& u : units_) ZR_RETURN_IF_ERROR(u->AfterStep());
  ZR_RETURN_IF_ERROR(compute.Synchronize());
  ZR_RETURN_IF_ERROR(scaler_.Update(false));
  EndStepOrder();
  result.step = steps_;
  return result;
}

}  // namespace zerort
