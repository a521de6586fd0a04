// HostGradientQueue: the backward's reduced gradient slices on their way into host-tier shards,
// added on a worker thread (a one-thread offload TaskPool) so that the thread issuing the
// backward's kernels never waits for them.
//
// [Note: host gradients in flight]
// A host-tier gradient shard (offload_optimizer cpu or nvme) fed by an asynchronous stream (the
// communication stream on CUDA or on cpu-async) would make the host wait, unit by unit, for the
// reduction and the copy before it could issue the next unit's backward: the device idles while
// the host adds. Instead the reduced slice is copied on that stream into a host staging buffer
// (pinned on CUDA) and an event recorded after it, and the slice is pushed here: the worker
// waits for each slice's event and adds it into its unit's shard, in push order (a unit's
// micro-batches in sequence, so sums are taken in the order a synchronous run takes them), while
// the issuing thread goes on with the next unit's backward. It waits only when kMaxInFlight
// slices are pushed and not yet added (the staging memory is bounded), and when a reader of the
// gradients (the norm, the step, zeroing; GradientReducer::Finish) calls Finish first. Until
// 2026-11-29 the issuing thread added each slice itself once the next was issued: it then issued
// no kernels while it waited for the copy and added, and a device whose unit's backward is shorter
// than the add went idle (the host-optimizer GPU step is 1.68x the device-only one). After a
// failed add the later slices are only waited for, not added; a slice's staging is freed by the
// worker once its copy has landed, before the slice counts as done; the destructor runs what is
// queued (each waiting for its copy) before it returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "zerort/offload/task_pool.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

class HostGradientQueue {
 public:
  // Adds a staged slice (host memory) into unit `unit`'s host shard; run on the worker thread,
  // one slice at a time.
  using Add = std::function<Status(int unit, const TensorView& staged)>;
  static constexpr size_t kMaxInFlight = 4;

  explicit HostGradientQueue(Add add) : add_(std::move(add)) {}

  // A slice being copied into `staged` on a stream, `copied` recorded there after the copy. Fails
  // with the first add that failed (the slice is still waited for, not added). One pushing thread.
  Status Push(int unit, Buffer staged, DType dtype, int64_t numel, std::unique_ptr<Event> copied);
  // Returns once every slice pushed is added: the first failure, if any.
  Status Finish();
  // Seconds the pushing thread waited (a full queue, Finish) and the worker spent adding, since
  // the last call; taken by the pushing thread.
  struct Seconds {
    double wait_s = 0, add_s = 0;
  };
  Seconds TakeSeconds();

 private:
  // Waits for the oldest slice; keeps the first failure.
  void WaitOldest();

  Add add_;
  std::atomic<bool> failed_{false};  // an add failed: the worker adds nothing more
  std::atomic<int64_t> add_ns_{0};   // the worker's adding time
  Status error_;                     // the first failure the pushing thread has seen
  double wait_s_ = 0;                // the pushing thread's waits
  std::deque<Task> in_flight_;       // pushed, oldest first
  TaskPool worker_{1};               // last: destroyed (drained, joined) before the above
};

}  // namespace zerort
