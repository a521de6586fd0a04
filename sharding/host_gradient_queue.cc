#include "zerort/sharding/host_gradient_queue.h"

#include <chrono>
#include <utility>

namespace zerort {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

HostGradientQueue::HostGradientQueue(Add add) : add_(std::move(add)) {}

HostGradientQueue::~HostGradientQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;  // the worker still waits for every copy in flight, and adds nothing more
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void HostGradientQueue::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing in flight
    Slice& s = queue_.front();
    const bool add = error_.ok() && !stop_;
    lock.unlock();
    // The copy writes the staging buffer until its event: waited for even when nothing is added.
    Status status = s.copied->Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    if (status.ok() && add) {
      status = add_(s.unit, TensorView(s.staged.data(), s.dtype, {s.numel}, Device::Cpu()));
    }
    const double added = SecondsSince(t0);
    lock.lock();
    add_s_ += added;
    if (!status.ok() && error_.ok()) error_ = status;
    done_.push_back(std::move(queue_.front()));
    queue_.pop_front();
    changed_.notify_all();
  }
}

void HostGradientQueue::FreeDone(std::unique_lock<std::mutex>& lock) {
  std::vector<Slice> done = std::exchange(done_, {});
  lock.unlock();
  done.clear();  // the staging buffers go back to their allocator on this thread
  lock.lock();
}

Status HostGradientQueue::Push(int unit, Buffer staged, DType dtype, int64_t numel,
                               std::unique_ptr<Event> copied) {
  std::unique_lock lock(mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
  FreeDone(lock);
  if (!error_.ok()) {
    const Status error = error_;
    lock.unlock();
    (void)copied->Synchronize();  // the copy writes `staged` until then
    return error;
  }
  if (queue_.size() >= kMaxInFlight) {
    const auto t0 = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return queue_.size() < kMaxInFlight; });
    wait_s_ += SecondsSince(t0);
    FreeDone(lock);
  }
  queue_.push_back({unit, std::move(staged), dtype, numel, std::move(copied)});
  lock.unlock();
  changed_.notify_all();
  return absl::OkStatus();
}

Status HostGradientQueue::Finish() {
  std::unique_lock lock(mu_);
  if (!queue_.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return queue_.empty(); });
    wait_s_ += SecondsSince(t0);
  }
  FreeDone(lock);
  return error_;
}

HostGradientQueue::Seconds HostGradientQueue::TakeSeconds() {
  std::lock_guard lock(mu_);
  return {std::exchange(wait_s_, 0.0), std::exchange(add_s_, 0.0)};
}

}  // namespace zerort
