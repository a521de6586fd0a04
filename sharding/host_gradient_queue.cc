#include "zerort/sharding/host_gradient_queue.h"

#include <chrono>
#include <utility>

#include "zerort/runtime/scoped_seconds.h"

namespace zerort {

Status HostGradientQueue::Push(int unit, Buffer staged, DType dtype, int64_t numel,
                               std::unique_ptr<Event> copied) {
  if (in_flight_.size() >= kMaxInFlight) {
    ScopedSeconds timed(&wait_s_);
    WaitOldest();
  }
  struct Slice {
    Buffer staged;
    std::unique_ptr<Event> copied;
  };
  // Shared, as a std::function is copyable; released inside the task, so that the staging is
  // freed before the task counts as done.
  auto slice = std::make_shared<Slice>(Slice{std::move(staged), std::move(copied)});
  in_flight_.push_back(worker_.Submit([this, unit, dtype, numel, slice]() mutable -> Status {
    Status status = slice->copied->Synchronize();  // the copy writes the staging until then
    if (status.ok() && !failed_.load()) {
      const auto t0 = std::chrono::steady_clock::now();
      status = add_(unit, TensorView(slice->staged.data(), dtype, {numel}, Device::Cpu()));
      add_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
    }
    if (!status.ok()) failed_ = true;
    slice.reset();
    return status;
  }));
  return error_;
}

void HostGradientQueue::WaitOldest() {
  const Status status = in_flight_.front().Wait();
  in_flight_.pop_front();
  if (error_.ok()) error_ = status;
}

Status HostGradientQueue::Finish() {
  if (!in_flight_.empty()) {
    ScopedSeconds timed(&wait_s_);
    while (!in_flight_.empty()) WaitOldest();
  }
  return error_;
}

HostGradientQueue::Seconds HostGradientQueue::TakeSeconds() {
  return {std::exchange(wait_s_, 0.0), static_cast<double>(add_ns_.exchange(0)) * 1e-9};
}

}  // namespace zerort
