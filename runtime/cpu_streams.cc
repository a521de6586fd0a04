// CPU streams and events ([Note: the asynchronous CPU device] in device.h).
#include "zerort/runtime/internal/cpu_streams.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "zerort/runtime/strings.h"

namespace zerort::internal {
namespace {

// What a CPU event knows: the generation of its last Record and the highest generation whose
// point in its stream has been reached. Shared with the markers a queued stream runs, so an event
// may be destroyed while its marker is still queued.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  std::string recorder;  // the stream of the last Record (StreamWait::recorder)

  void Complete(uint64_t generation) {
    {
      std::lock_guard<std::mutex> lock(mu);
      completed = std::max(completed, generation);
    }
    cv.notify_all();
  }
  void WaitFor(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

class CpuEvent;

// Work runs when it is issued, on the issuing thread.
class ImmediateCpuStream final : public Stream {
 public:
  explicit ImmediateCpuStream(std::string name) : name_(std::move(name)) {}
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return name_; }
  Status Synchronize() override { return absl::OkStatus(); }
  Status WaitEvent(const Event& event) override;
  Status Launch(std::function<Status()> work) override { return work(); }
  void* native_handle() const override { return nullptr; }

 private:
  std::string name_;
};

// An in-order queue run by its own thread. The first failed item's error is the stream's from
// then on (as CUDA's are sticky): later work is not run and every Launch and Synchronize returns
// it. Markers (event records and waits) run regardless, so nothing waits forever on a failed
// stream.
class QueuedCpuStream final : public Stream {
 public:
  QueuedCpuStream(std::string name, const StreamOptions& options)
      : name_(std::move(name)),
        jitter_max_us_(options.jitter_seed != 0 ? std::max(0, options.jitter_max_us) : 0),
        rng_(options.jitter_seed ^ std::hash<std::string>()(name_)) {
    worker_ = std::thread([this] { Run(); });
  }
  ~QueuedCpuStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    issued_cv_.notify_all();
    worker_.join();  // after the queue drains: work already issued still runs, as on CUDA
  }
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return name_; }
  bool asynchronous() const override { return true; }
  Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    ZR_CHECK(std::this_thread::get_id() != worker_.get_id())
        << "stream '" << name_ << "' synchronized from its own work";
    done_cv_.wait(lock, [&] { return done_ == issued_; });
    return error_;
  }
  Status WaitEvent(const Event& event) override;
  Status Launch(std::function<Status()> work) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    Push(Item{std::move(work), false});
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }
  std::vector<StreamWait> TakeWaits() override {
    std::lock_guard<std::mutex> lock(waited_mu_);
    std::vector<StreamWait> taken(std::make_move_iterator(waits_.begin()),
                                  std::make_move_iterator(waits_.end()));
    waits_.clear();
    return taken;
  }
  // Called on this stream's thread by a WaitEvent marker.
  void AddWait(StreamWait wait) {
    std::lock_guard<std::mutex> lock(waited_mu_);
    if (waits_.size() == kStreamWaitsKept) waits_.pop_front();
    waits_.push_back(std::move(wait));
  }

  // Queues a marker: runs in order even after an error.
  void PushMarker(std::function<void()> marker) {
    std::lock_guard<std::mutex> lock(mu_);
    Push(Item{[m = std::move(marker)] {
                m();
                return absl::OkStatus();
              },
              true});
  }

 private:
  struct Item {
    std::function<Status()> work;
    bool marker = false;
  };
  void Push(Item item) {  // mu_ held
    queue_.push_back(std::move(item));
    ++issued_;
    issued_cv_.notify_one();
  }
  void Run() {
    for (;;) {
      Item item;
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        issued_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything issued has run
        item = std::move(queue_.front());
        queue_.pop_front();
        skip = !item.marker && !error_.ok();
      }
      if (jitter_max_us_ > 0) {  // [Note: jitter] (runtime/device.h)
        std::uniform_int_distribution<int> us(0, jitter_max_us_);
        std::this_thread::sleep_for(std::chrono::microseconds(us(rng_)));
      }
      Status status = skip ? absl::OkStatus() : item.work();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!status.ok() && error_.ok()) {
          error_ =
              absl::Status(status.code(), StrCat("on stream '", name_, "': ", status.message()));
        }
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  const std::string name_;
  const int jitter_max_us_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::condition_variable issued_cv_, done_cv_;
  std::deque<Item> queue_;
  uint64_t issued_ = 0, done_ = 0;
  Status error_;
  bool stopping_ = false;
  mutable std::mutex waited_mu_;
  std::deque<StreamWait> waits_;  // since the last TakeWaits
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  Device device() const override { return Device::Cpu(); }
  Status Record(Stream& stream) override {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(
          StrCat("CPU event recorded on a stream of ", stream.device().ToString()));
    }
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      generation = ++state_->recorded;
      state_->recorder = stream.name();
    }
    if (auto* queued = dynamic_cast<QueuedCpuStream*>(&stream)) {
      queued->PushMarker([state = state_, generation] { state->Complete(generation); });
    } else {
      state_->Complete(generation);
    }
    return absl::OkStatus();
  }
  StatusOr<bool> Query() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->completed >= state_->recorded;
  }
  Status Synchronize() const override {
    state_->WaitFor(Recorded());
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }

  uint64_t Recorded() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->recorded;
  }
  std::string Recorder() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->recorder;
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_ = std::make_shared<EventState>();
};

// The CPU event behind `event`, or an error naming the stream.
StatusOr<const CpuEvent*> CpuEventOf(const Event& event, std::string_view stream) {
  const auto* cpu = dynamic_cast<const CpuEvent*>(&event);
  if (!event.device().is_cpu() || cpu == nullptr) {
    return absl::InvalidArgumentError(StrCat(
        "CPU stream '", stream, "' cannot wait for an event on ", event.device().ToString()));
  }
  return cpu;
}

// An immediate stream's next work runs on the host at once: the host waits for the event now.
Status ImmediateCpuStream::WaitEvent(const Event& event) {
  ZR_ASSIGN_OR_RETURN(const CpuEvent* cpu, CpuEventOf(event, name_));
  return cpu->Synchronize();
}

// The record current when WaitEvent is called is the one waited for (CUDA's rule).
Status QueuedCpuStream::WaitEvent(const Event& event) {
  ZR_ASSIGN_OR_RETURN(const CpuEvent* cpu, CpuEventOf(event, name_));
  PushMarker(
      [this, state = cpu->state(), generation = cpu->Recorded(), recorder = cpu->Recorder()] {
        const auto begin = std::chrono::system_clock::now();
        state->WaitFor(generation);
        if (recorder != name_) AddWait({recorder, begin, std::chrono::system_clock::now()});
      });
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Stream> CreateCpuStream(std::string name, const StreamOptions& options) {
  if (options.cpu == CpuExecution::kQueued) {
    return std::make_unique<QueuedCpuStream>(std::move(name), options);
  }
  return std::make_unique<ImmediateCpuStream>(std::move(name));
}

std::unique_ptr<Event> CreateCpuEvent() { return std::make_unique<CpuEvent>(); }

}  // namespace zerort::internal
