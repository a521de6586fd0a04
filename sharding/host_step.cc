// ShardedOptimizer's deferred host step: [Note: the host step behind the forward]
// (sharded_optimizer.h).
#include <chrono>

#include "zerort/offload/task_pool.h"
#include "zerort/runtime/scoped_seconds.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/optimizer_state.h"

namespace zerort {

bool ShardedOptimizer::DefersStep() const {
  return !units_.empty() && DefersHostStep(*resources_.options, resources_.compute->asynchronous(),
                                           static_cast<int>(units_.size()));
}

int ShardedOptimizer::Ahead() const {
  for (const auto& s : units_) {
    const ComputeCopy copy = s->unit->compute_copy();
    if (copy.buffer != nullptr && copy.buffer->View().device() != s->master.View().device()) {
      return kStagedAhead;
    }
  }
  return static_cast<int>(units_.size());
}

Status ShardedOptimizer::SubmitDeferred() {
  DeferredStep& d = *deferred_;
  const int n = static_cast<int>(units_.size());
  // Device-tier units were updated by Step ([Note: partial optimizer offload]).
  while (d.submitted < n && tier(d.submitted) == MemoryTier::kDevice) ++d.submitted;
  if (d.submitted == n) return absl::OkStatus();
  const int u = d.submitted;
  DeferredStep::UnitWork& w = d.units[u];
  // The staging is allocated here, on the issuing thread, as every allocation of the run is.
  ZR_ASSIGN_OR_RETURN(w.out, UpdateTarget(u, &w.staged));
  // [Note: gradient sums on the device]: the sum copied to the host and the device shard zeroed
  // on the sums' stream once the step's last adds and norm have run (grads_final: today also
  // implied by the manager's host read of the norm, which synchronises the compute stream; the
  // wait keeps the order without it), issued here (the worker issues nothing); the worker waits
  // for the copy and the fill.
  const bool device_sums = GradOnDevice(u);
  TensorView grad;
  if (device_sums) {
    Stream& sums = SumsStream();
    if (d.grads_final) ZR_RETURN_IF_ERROR(sums.WaitEvent(*d.grads_final));
    ZR_ASSIGN_OR_RETURN(grad, StageGradient(u, &w.grad_staged, sums, true));
    StatusOr<std::unique_ptr<Event>> copied = CreateEvent(sums.device());
    Status recorded = copied.status();
    if (copied.ok()) recorded = (*copied)->Record(sums);
    if (!recorded.ok()) {
      (void)sums.Synchronize();  // the copy writes the staging until then
      return recorded;
    }
    w.grad_copied = *std::move(copied);
  }
  if (!step_worker_) step_worker_ = std::make_unique<TaskPool>(1);
  w.task = step_worker_->Submit([this, u, &d, &w, grad, device_sums]() -> Status {
    w.begin = std::chrono::system_clock::now();
    Status status = device_sums ? w.grad_copied->Synchronize() : absl::OkStatus();
    if (status.ok()) status = UpdateUnit(u, d.args, w.out, device_sums ? grad : GradView(u));
    // The next backward adds into the shard only after this unit is completed.
    if (status.ok()) status = ZeroGradient(u, !device_sums);
    w.end = std::chrono::system_clock::now();
    return status;
  });
  ++d.submitted;
  return absl::OkStatus();
}

Status ShardedOptimizer::CompleteUnitStep(int u) {
  while (deferred_ && deferred_->completed <= u &&
         deferred_->completed < static_cast<int>(units_.size())) {
    ZR_RETURN_IF_ERROR(CompleteNext());
  }
  return absl::OkStatus();
}

Status ShardedOptimizer::CompleteNext() {
  DeferredStep& d = *deferred_;
  const int u = d.completed;
  DeferredStep::UnitWork& w = d.units[u];
  if (!w.task) {  // a device-tier unit: updated by Step itself
    ++d.completed;
    return absl::OkStatus();
  }
  {
    ScopedSeconds timed(resources_.stats ? &resources_.stats->update_wait_s : nullptr);
    ZR_RETURN_IF_ERROR(
        Annotate(w.task.Wait(), StrCat("optimizer step of unit '", units_[u]->unit->name(), "'")));
  }
  if (resources_.stats != nullptr) {
    resources_.stats->optimizer_s += std::chrono::duration<double>(w.end - w.begin).count();
  }
  if (resources_.span != nullptr && *resources_.span) {
    (*resources_.span)(StrCat("optimizer ", units_[u]->unit->name()), "host step", w.begin, w.end);
  }
  if (w.staged) {  // [Note: the host step's write-backs]
    ZR_RETURN_IF_ERROR(IssueWriteBack(u, std::move(w.staged), d.write_backs, kStagedAhead));
  }
  // [Note: gradient sums on the device]: the update has run, so its wait for the copy and the
  // device shard's fill has returned: the next backward's adds, issued later, follow the fill.
  w.grad_copied.reset();
  w.grad_staged = ::zerort::Buffer();
  w.out = TensorView();
  ++d.completed;
  if (d.submitted < static_cast<int>(units_.size())) return SubmitDeferred();
  return absl::OkStatus();
}

}  // namespace zerort
