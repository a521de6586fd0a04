// ShardManager: scopes, prefetch in recorded order within the live-bytes budget, and the step
// (its creation, units and initial values: shard_manager_setup.cc).
#include "zerort/sharding/shard_manager.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/scoped_seconds.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {
constexpr uint8_t kForwardScope = 1, kBackwardScope = 2;
}  // namespace

// ---------------------------------------------------------------- UnitScope

UnitScope::UnitScope(UnitScope&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      unit_(other.unit_),
      backward_(other.backward_),
      lease_(std::move(other.lease_)) {}

UnitScope::~UnitScope() {
  if (manager_ != nullptr) ZR_CHECK_OK(End());
}

TensorView UnitScope::param(int i) const {
  ZR_CHECK(manager_ != nullptr) << "param() of an ended scope";
  return manager_->units_[unit_]->Param(i).Leased(lease_);
}

TensorView UnitScope::grad(int i) const {
  ZR_CHECK(manager_ != nullptr && backward_) << "grad() outside a backward scope";
  return manager_->units_[unit_]->grad().Param(i).Leased(lease_);
}

Status UnitScope::End() {
  if (manager_ == nullptr) return absl::OkStatus();
  ShardManager* manager = std::exchange(manager_, nullptr);
  lease_->Revoke("its scope's End()");
  return manager->EndScope(unit_, backward_);
}

// ---------------------------------------------------------------- ShardManager

Status ShardManager::AfterStep() {
  ZR_RETURN_IF_ERROR(optimizer_->ZeroGradients());
  return RefreshComputeCopies();
}

Status ShardManager::SettleThrough(int unit) {
  for (; settled_ <= unit && settled_ < num_units(); ++settled_) {
    ZR_RETURN_IF_ERROR(optimizer_->CompleteUnitStep(settled_));
    ZR_RETURN_IF_ERROR(units_[settled_]->RefreshAfterStep());
  }
  return absl::OkStatus();
}

Status ShardManager::RefreshComputeCopies() {
  for (auto& u : units_) ZR_RETURN_IF_ERROR(u->RefreshAfterStep());
  return absl::OkStatus();
}

int64_t ShardManager::live_gathered_bytes() const {
  const int64_t elem = static_cast<int64_t>(DTypeSize(options_.compute_dtype));
  return planner_ ? planner_->LiveNumel(Resident()) * elem : 0;
}

Status ShardManager::Prefetch() {
  // Offloaded compute shards: start reading the next units' shards from NVMe, as far ahead as
  // the fetch buffers allow (offload_param.buffer_count), always leaving one for a unit needed
  // out of the recorded order (a model that changes its order mid-step).
  if (param_staging_) {
    for (int i : planner_->Upcoming()) {
      if (param_staging_->available() <= 1) break;
      ShardedUnit& u = *units_[i];
      // (NVMe parameters need NVMe optimizer state, whose step is never deferred: the shard
      // read here is the last step's, [Note: the host step behind the forward].)
      if (!u.persistent() && u.state() == ShardState::kSharded) ZR_RETURN_IF_ERROR(u.StartFetch());
    }
  }
  // Then issue the gathers the plan names ([Note: the gather plan]). A gather whose fetch is
  // still reading waits for it: which gathers are issued must not depend on I/O timing, or ranks
  // would issue their collectives in different orders.
  // While a deferred step's units are being completed ([Note: the host step behind the
  // forward]), a prefetch completes at most one unit beyond those already completed, so that the
  // forward's first units do not wait for the whole step; `settled_` is the same on every rank at
  // this point, so is what is prefetched (the memory model replays the same rule).
  const int limit = settled_;
  for (int i : planner_->Prefetch(Resident())) {
    if (i > limit) break;
    ZR_RETURN_IF_ERROR(SettleThrough(i));
    ZR_RETURN_IF_ERROR(units_[i]->StartGather());
  }
  return absl::OkStatus();
}

GatherPlanner::Resident ShardManager::Resident() const {
  return [this](int i) {
    const ShardState s = units_[i]->state();
    return s == ShardState::kGathering || s == ShardState::kUnsharded;
  };
}

Status ShardManager::EnsureGathered(int unit) {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (unit < 0 || unit >= num_units()) {
    return absl::InvalidArgumentError(
        StrCat("unit index ", unit, " out of range (", num_units(), " units)"));
  }
  ZR_RETURN_IF_ERROR(SettleThrough(unit));
  ShardedUnit& u = *units_[unit];
  if (!planner_->BeginUse(unit)) {
    // The model changed its order (a branch, say): no more prefetch this step; re-record next.
    Logger()->debug("unit order changed at unit '{}'; prefetch re-records next step", u.name());
  }
  if (!u.persistent() &&
      (u.state() == ShardState::kSharded || u.state() == ShardState::kFetching)) {
    ZR_RETURN_IF_ERROR(u.StartGather());
  }
  ZR_RETURN_IF_ERROR(u.FinishGather());
  if (planner_->replaying()) ZR_RETURN_IF_ERROR(Prefetch());
  return absl::OkStatus();
}

StatusOr<UnitScope> ShardManager::ForwardScope(int unit) {
  const ScopedSeconds timed(&step_times_.gather_forward);
  ZR_RETURN_IF_ERROR(EnsureGathered(unit));
  scopes_since_step_[unit] |= kForwardScope;
  return OpenScope(unit, false);
}

StatusOr<UnitScope> ShardManager::BackwardScope(int unit) {
  const ScopedSeconds timed(&step_times_.gather_backward);
  ZR_RETURN_IF_ERROR(EnsureGathered(unit));
  ZR_RETURN_IF_ERROR(units_[unit]->grad().BeginBackward());
  scopes_since_step_[unit] |= kBackwardScope;
  return OpenScope(unit, true);
}

StatusOr<UnitScope> ShardManager::OpenScope(int unit, bool backward) {
  return UnitScope(this, unit, backward,
                   std::make_shared<ViewLease>(scope_names_[unit][backward ? 1 : 0]));
}

Status ShardManager::CheckScopesPaired() {
  // Forward without Backward only: a Backward scope may compute its unit's forward too (the
  // GPT head on a last pipeline stage computes the logits inside the embedding's backward scope;
  // activation recomputation), so a backward alone is legitimate.
  for (size_t i = 0; i < units_.size(); ++i) {
    const uint8_t used = std::exchange(scopes_since_step_[i], 0);
    if (used != kForwardScope || !unit_options_[i].needs_backward) continue;
    std::fill(scopes_since_step_.begin(), scopes_since_step_.end(), 0);
    return absl::FailedPreconditionError(
        StrCat("Step on data-parallel rank ", resources_.dp->rank(), "/", resources_.dp->size(),
               ": unit '", units_[i]->name(),
               "' had a Forward scope and no Backward scope since the last step (its backward was "
               "skipped: it would get no gradient; a unit without gradients, such as a frozen "
               "layer, sets UnitOptions::needs_backward = false)"));
  }
  return absl::OkStatus();
}

Status ShardManager::EndScope(int unit, bool backward) {
  ShardedUnit& u = *units_[unit];
  if (backward && (options_.stage == ZeroStage::k2 || options_.stage == ZeroStage::k3) &&
      !options_.reduce_at_step) {
    const ScopedSeconds timed(&step_times_.reduce_backward);
    ZR_RETURN_IF_ERROR(reducer_->Add(u));
  }
  // Used again soon: kept, released at that use's end or at the step ([Note: the gather plan]).
  if (planner_->EndUse(unit, Resident())) return absl::OkStatus();
  return u.Release();
}

Status ShardManager::ReduceGradients() {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  if (gradients_reduced_) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(SettleAll());  // a unit no scope used since a deferred step
  const ScopedSeconds timed(&step_times_.reduce_step);
  if (options_.reduce_at_step &&
      (options_.stage == ZeroStage::k2 || options_.stage == ZeroStage::k3)) {
    // Every full gradient kept through the micro-batches, reduced now, last unit first (the
    // order a backward ends them in; any order the data-parallel ranks share would do).
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
      if ((*it)->grad().held()) ZR_RETURN_IF_ERROR(reducer_->Add(**it));
    }
  }
  // The 1-bit optimizers' steps without a gradient all-reduce ([Note: 1-bit Adam]).
  ZR_RETURN_IF_ERROR(reducer_->Finish(units_, optimizer_->ReducesGradients(steps_ + 1)));
  // Tied units: this rank's shard summed over the ranks that hold the same unit.
  for (size_t i = 0; i < units_.size(); ++i) {
    Communicator* tied = unit_options_[i].tied;
    if (tied == nullptr || tied->size() == 1) continue;
    const TensorView g = optimizer_->GradShard(static_cast<int>(i));
    Stream* stream = optimizer_->GradStream(static_cast<int>(i));
    tied->recorder().SetLabel(StrCat("tied gradient of ", units_[i]->name()));
    if (stream == nullptr && !tied->moves_host_memory()) {
      // Host shards (the optimizer offloaded) and NCCL, which reads device memory only: staged
      // through the device on the compute stream, after the work that wrote them.
      ZR_RETURN_IF_ERROR(
          AllReduceHostValues(*tied, *resources_.device_allocator, *resources_.compute, g.data(),
                              static_cast<size_t>(g.numel()), DType::kF32, ReduceOp::kSum));
    } else {
      if (stream == nullptr) {
        ZR_RETURN_IF_ERROR(resources_.compute->Synchronize());  // host shards: written by then
      }
      ZR_RETURN_IF_ERROR(
          tied->AllReduce(g.data(), g.data(), g.numel(), DType::kF32, ReduceOp::kSum, stream));
    }
    tied->recorder().SetLabel("");
  }
  gradients_reduced_ = true;
  return absl::OkStatus();
}

StatusOr<StepResult> ShardManager::Step(const StepInputs& inputs) {
  if (!initialized_) return absl::FailedPreconditionError("Initialize the ShardManager first");
  // The optimizer's share: the step's wall time less the reductions it completes.
  const double reduce_before = step_times_.reduce_step;
  double step_seconds = 0;
  StatusOr<StepResult> result = [&] {
    const ScopedSeconds timed(&step_seconds);
    return StepImpl(inputs);
  }();
  step_times_.optimizer += step_seconds - (step_times_.reduce_step - reduce_before);
  return result;
}

StatusOr<StepResult> ShardManager::StepImpl(const StepInputs& inputs) {
  if (inputs.micro_batches < 1) {
    return absl::InvalidArgumentError(
        StrCat("micro_batches ", inputs.micro_batches, " is below 1"));
  }
  if (!(inputs.lr >= 0))
    return absl::InvalidArgumentError(StrCat("learning rate ", inputs.lr, " is negative"));
  ZR_RETURN_IF_ERROR(SettleAll());
  ZR_RETURN_IF_ERROR(CheckScopesPaired());
  // Kept gathered for a reuse that did not come: released. Prefetched for a use that did not
  // come (the model changed its order): a fetch gives its buffer back, a gather is completed and
  // released. A scope still open is the caller's bug.
  for (int i : planner_->TakeKept()) ZR_RETURN_IF_ERROR(units_[i]->Release());
  for (const std::unique_ptr<ShardedUnit>& u : units_) {
    ZR_RETURN_IF_ERROR(u->CancelFetch());
    if (!u->persistent() && u->state() == ShardState::kGathering) {
      ZR_RETURN_IF_ERROR(u->FinishGather());
      ZR_RETURN_IF_ERROR(u->Release());
    }
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
  ZR_RETURN_IF_ERROR(optimizer_->AccumulateNorm(sum_sq, nonfinite));
  // On the device buffer and the compute stream, so that an NCCL group works as well as MPI.
  // Stage 0 holds the whole, identical gradient on every rank: its sums are already global.
  // The 1-bit optimizers' steps without a gradient all-reduce hold each rank's own gradient: the
  // sums are averaged over the ranks (the norm is the root mean square of the local norms), so
  // that every rank clips by the same coefficient and skips the same steps. DeepSpeed clips each
  // rank by its own norm.
  const bool local_gradients = !optimizer_->ReducesGradients(steps_ + 1);
  if (options_.stage != ZeroStage::k0 || local_gradients) {
    ZR_RETURN_IF_ERROR(resources_.dp->AllReduce(acc.data(), acc.data(), 2, DType::kF32,
                                                local_gradients ? ReduceOp::kAvg : ReduceOp::kSum,
                                                &compute));
  }
  // Then over the ranks holding the other parts of the model (replicated parameters entered on
  // tensor-parallel rank 0 only), so every rank of every group takes the same decision.
  if (resources_.model_parallel != nullptr && resources_.model_parallel->size() > 1) {
    resources_.model_parallel->recorder().SetLabel("gradient norm over the model-parallel group");
    ZR_RETURN_IF_ERROR(resources_.model_parallel->AllReduce(acc.data(), acc.data(), 2, DType::kF32,
                                                            ReduceOp::kSum, &compute));
    resources_.model_parallel->recorder().SetLabel("");
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
    ZR_RETURN_IF_ERROR(AfterStep());
    ZR_RETURN_IF_ERROR(scaler_.Update(true));
    Logger()->warn("step {} skipped: non-finite gradients (loss scale {} -> {})", steps_ + 1,
                   loss_scale, scaler_.scale());
    planner_->EndStep();
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
  ZR_ASSIGN_OR_RETURN(const StepCompletion completion, optimizer_->Step(args));
  if (completion == StepCompletion::kPerUnit) {
    settled_ = 0;  // [Note: the host step behind the forward]: completed at each unit's next use
  } else {
    ZR_RETURN_IF_ERROR(AfterStep());
    ZR_RETURN_IF_ERROR(compute.Synchronize());
  }
  ZR_RETURN_IF_ERROR(scaler_.Update(false));
  planner_->EndStep();
  result.step = steps_;
  return result;
}

}  // namespace zerort
