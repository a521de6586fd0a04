// HostGradientQueue ([Note: host gradients in flight], sharding/host_gradient_queue.h): slices
// are added in push order on the worker, each only after its copy's event, the pushing thread
// waits only at kMaxInFlight slices or in Finish, a failure stops the adds and is returned, the
// staging is freed by the time Finish returns, and the destructor waits for every copy in
// flight.
#include "zerort/sharding/host_gradient_queue.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/memory.h"

namespace zerort {
namespace {

// An event the test completes by hand: Synchronize blocks until Complete.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> waited{0};
  void Complete() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};
class GatedEvent final : public Event {
 public:
  explicit GatedEvent(Gate* gate) : gate_(gate) {}
  Device device() const override { return Device::Cpu(); }
  Status Record(Stream&) override { return absl::OkStatus(); }
  StatusOr<bool> Query() const override {
    std::lock_guard lock(gate_->mu);
    return gate_->open;
  }
  Status Synchronize() const override {
    std::unique_lock lock(gate_->mu);
    gate_->cv.wait(lock, [&] { return gate_->open; });
    ++gate_->waited;
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }

 private:
  Gate* gate_;
};

struct Fixture {
  MemoryTracker tracker;
  HostAllocator host{{.tier = MemoryTier::kHost, .tracker = &tracker}};
  Buffer Slice(float value) {
    Buffer b = *host.Allocate(4 * sizeof(float), MemoryCategory::kStaging, nullptr);
    for (int i = 0; i < 4; ++i) b.as<float>()[i] = value;
    return b;
  }
};

TEST(HostGradientQueueTest, AddsInPushOrderEachAfterItsCopy) {
  Fixture f;
  std::mutex mu;
  std::vector<std::pair<int, float>> added;
  HostGradientQueue queue([&](int unit, const TensorView& v) {
    std::lock_guard lock(mu);
    added.push_back({unit, static_cast<const float*>(v.data())[3]});
    return absl::OkStatus();
  });
  std::vector<Gate> gates(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(queue
                    .Push(10 + i, f.Slice(static_cast<float>(i)), DType::kF32, 4,
                          std::make_unique<GatedEvent>(&gates[i]))
                    .ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(added.empty()) << "added before its copy finished";
  }
  gates[2].Complete();  // the last copy finishing first adds nothing out of order
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(added.empty());
  }
  gates[0].Complete();
  gates[1].Complete();
  ASSERT_TRUE(queue.Finish().ok());
  const std::vector<std::pair<int, float>> want = {{10, 0.0f}, {11, 1.0f}, {12, 2.0f}};
  EXPECT_EQ(added, want);
  // Every staging buffer went back by Finish, on this thread.
  EXPECT_EQ(f.tracker.InUse(MemoryTier::kHost).current, 0);
}

TEST(HostGradientQueueTest, ThePusherWaitsOnlyWhenTheQueueIsFull) {
  Fixture f;
  std::atomic<int> adds{0};
  HostGradientQueue queue([&](int, const TensorView&) {
    ++adds;
    return absl::OkStatus();
  });
  std::vector<Gate> gates(HostGradientQueue::kMaxInFlight + 1);
  for (size_t i = 0; i < HostGradientQueue::kMaxInFlight; ++i) {
    ASSERT_TRUE(
        queue.Push(0, f.Slice(1), DType::kF32, 4, std::make_unique<GatedEvent>(&gates[i])).ok());
  }
  std::atomic<bool> pushed{false};
  std::thread pusher([&] {
    EXPECT_TRUE(queue
                    .Push(0, f.Slice(1), DType::kF32, 4,
                          std::make_unique<GatedEvent>(&gates[HostGradientQueue::kMaxInFlight]))
                    .ok());
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(pushed) << "a full queue took one more slice";
  gates[0].Complete();
  pusher.join();
  EXPECT_TRUE(pushed);
  for (Gate& g : gates) g.Complete();
  ASSERT_TRUE(queue.Finish().ok());
  EXPECT_EQ(adds, static_cast<int>(HostGradientQueue::kMaxInFlight) + 1);
  (void)queue.TakeSeconds();  // taken once: the counts restart
  const HostGradientQueue::Seconds again = queue.TakeSeconds();
  EXPECT_EQ(again.wait_s, 0.0);
  EXPECT_EQ(again.add_s, 0.0);
}

TEST(HostGradientQueueTest, AFailureStopsTheAddsAndIsReturned) {
  Fixture f;
  std::atomic<int> adds{0};
  HostGradientQueue queue([&](int unit, const TensorView&) {
    ++adds;
    return unit == 1 ? absl::DataLossError("unit 1's shard") : absl::OkStatus();
  });
  std::vector<Gate> gates(4);
  for (Gate& g : gates) g.Complete();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        queue.Push(i, f.Slice(1), DType::kF32, 4, std::make_unique<GatedEvent>(&gates[i])).ok());
  }
  const Status finished = queue.Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss) << finished;
  EXPECT_EQ(adds, 2);  // unit 2's slice is not added after unit 1 failed
  // A later push returns the failure; its slice is waited for, not added.
  const Status pushed =
      queue.Push(3, f.Slice(1), DType::kF32, 4, std::make_unique<GatedEvent>(&gates[3]));
  EXPECT_EQ(pushed.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(queue.Finish().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(gates[3].waited, 1);
  EXPECT_EQ(adds, 2);
}

TEST(HostGradientQueueTest, DestructionWaitsForTheCopiesInFlight) {
  Fixture f;
  std::atomic<int> adds{0};
  std::vector<Gate> gates(2);
  std::thread opener;
  {
    HostGradientQueue queue([&](int, const TensorView&) {
      ++adds;
      return absl::OkStatus();
    });
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(
          queue.Push(i, f.Slice(1), DType::kF32, 4, std::make_unique<GatedEvent>(&gates[i])).ok());
    }
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (Gate& g : gates) g.Complete();
    });
  }  // returns only once both copies finished
  EXPECT_EQ(gates[0].waited + gates[1].waited, 2);
  opener.join();
  EXPECT_EQ(f.tracker.InUse(MemoryTier::kHost).current, 0);
}

}  // namespace
}  // namespace zerort
