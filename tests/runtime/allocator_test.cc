// Allocators: host accounting; the caching allocator's reuse, splitting, merging and stream
// awareness, on a backend whose segments and events the test controls; the CPU caching
// allocator. The CUDA allocators are tested in cuda_allocator_test.cc (gpu label).
#include "zerort/runtime/allocator.h"

#include <cstring>
#include <map>

#include "gtest/gtest.h"

namespace zerort {
namespace {

// A stream whose completed-work counter the test advances by hand.
class FakeStream final : public Stream {
 public:
  explicit FakeStream(std::string name) : name_(std::move(name)) {}
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return name_; }
  Status Synchronize() override {
    completed = issued;
    return absl::OkStatus();
  }
  Status WaitEvent(const Event&) override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }
  int issued = 0;     // work items issued
  int completed = 0;  // work items finished

 private:
  std::string name_;
};

class FakeEvent final : public Event {
 public:
  Device device() const override { return Device::Cpu(); }
  Status Record(Stream& stream) override {
    stream_ = static_cast<FakeStream*>(&stream);
    mark_ = stream_->issued;
    return absl::OkStatus();
  }
  StatusOr<bool> Query() const override {
    return stream_ == nullptr || stream_->completed >= mark_;
  }
  Status Synchronize() const override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }

 private:
  FakeStream* stream_ = nullptr;
  int mark_ = 0;
};

class FakeBackend final : public CachingBackend {
 public:
  struct Counters {
    int maps = 0;
    int unmaps = 0;
    int syncs = 0;
    size_t capacity = SIZE_MAX;  // Map fails when the mapped total would exceed this
    size_t mapped = 0;
    std::vector<FakeStream*> streams;  // synchronised by SynchronizeDevice
  };
  explicit FakeBackend(Counters* c) : c_(c) {}
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return "fake_map"; }
  StatusOr<void*> Map(size_t bytes) override {
    if (c_->mapped + bytes > c_->capacity)
      return absl::ResourceExhaustedError("fake device is full");
    ++c_->maps;
    c_->mapped += bytes;
    return std::aligned_alloc(4096, bytes);
  }
  void Unmap(void* p, size_t bytes) override {
    ++c_->unmaps;
    c_->mapped -= bytes;
    std::free(p);
  }
  Status SynchronizeDevice() override {
    ++c_->syncs;
    for (FakeStream* s : c_->streams) s->completed = s->issued;
    return absl::OkStatus();
  }
  StatusOr<std::unique_ptr<Event>> NewEvent() override { return std::make_unique<FakeEvent>(); }

 private:
  Counters* c_;
};

struct Fixture {
  FakeBackend::Counters counters;
  MemoryTracker tracker;
  std::unique_ptr<CachingAllocator> allocator;
  Fixture() {
    CachingAllocatorOptions o;
    o.tracker = &tracker;
    allocator = std::make_unique<CachingAllocator>(std::make_unique<FakeBackend>(&counters), o);
  }
};

TEST(HostAllocatorTest, AlignedAndAccounted) {
  MemoryTracker tracker;
  HostAllocator allocator({.alignment = 4096, .tier = MemoryTier::kHost, .tracker = &tracker});
  {
    StatusOr<Buffer> b = allocator.Allocate(1000, MemoryCategory::kOptimizerState, nullptr);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    std::memset(b->data(), 1, 1000);
    EXPECT_EQ(tracker.Usage(MemoryTier::kHost, MemoryCategory::kOptimizerState).current, 1000);
    EXPECT_EQ(tracker.Reserved(MemoryTier::kHost).current, 4096);
  }
  EXPECT_EQ(tracker.Usage(MemoryTier::kHost, MemoryCategory::kOptimizerState).current, 0);
  EXPECT_EQ(tracker.Usage(MemoryTier::kHost, MemoryCategory::kOptimizerState).peak, 1000);
  EXPECT_EQ(tracker.Reserved(MemoryTier::kHost).current, 0);
}

TEST(CachingAllocatorTest, ReusesWithoutMappingPerLayer) {
  Fixture f;
  FakeStream compute("compute");
  // A training-step-like pattern: per layer, allocate activations and workspace, then free.
  for (int step = 0; step < 5; ++step) {
    std::vector<Buffer> live;
    for (int layer = 0; layer < 12; ++layer) {
      live.push_back(*f.allocator->Allocate(3 << 20, MemoryCategory::kActivations, &compute));
      Buffer ws = *f.allocator->Allocate(100'000, MemoryCategory::kWorkspace, &compute);
    }
  }
  const int maps_after_warmup = f.counters.maps;
  for (int step = 0; step < 5; ++step) {
    std::vector<Buffer> live;
    for (int layer = 0; layer < 12; ++layer) {
      live.push_back(*f.allocator->Allocate(3 << 20, MemoryCategory::kActivations, &compute));
      Buffer ws = *f.allocator->Allocate(100'000, MemoryCategory::kWorkspace, &compute);
    }
  }
  EXPECT_EQ(f.counters.maps, maps_after_warmup) << "steady state must not map new segments";
  EXPECT_EQ(f.tracker.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).peak,
            12 * (3 << 20));
  EXPECT_EQ(f.tracker.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).current, 0);
  EXPECT_EQ(f.tracker.Usage(MemoryTier::kDevice, MemoryCategory::kWorkspace).peak, 100'000);
  EXPECT_EQ(f.allocator->stats().allocated_bytes, 0);
}

TEST(CachingAllocatorTest, SplitsSmallSegmentsAndMergesOnFree) {
  Fixture f;
  std::vector<Buffer> smalls;
  for (int i = 0; i < 8; ++i) {
    smalls.push_back(*f.allocator->Allocate(1000, MemoryCategory::kWorkspace, nullptr));
  }
  EXPECT_EQ(f.counters.maps, 1) << "eight small blocks share one 2 MiB segment";
  EXPECT_EQ(f.allocator->stats().allocated_bytes, 8 * 1024);
  smalls.clear();
  // Merged back into one free 2 MiB block: a 1 MiB request fits without a new segment.
  Buffer big = *f.allocator->Allocate(1 << 20, MemoryCategory::kWorkspace, nullptr);
  EXPECT_EQ(f.counters.maps, 1);
  big.Reset();
  ASSERT_TRUE(f.allocator->EmptyCache().ok());
  EXPECT_EQ(f.counters.unmaps, 1);
  EXPECT_EQ(f.tracker.Reserved(MemoryTier::kDevice).current, 0);
}

TEST(CachingAllocatorTest, BlocksAreReusedOnlyByTheirStream) {
  Fixture f;
  FakeStream a("a");
  FakeStream b("b");
  void* first = nullptr;
  {
    Buffer x = *f.allocator->Allocate(8 << 20, MemoryCategory::kGatheredWeights, &a);
    first = x.data();
  }
  Buffer on_b = *f.allocator->Allocate(8 << 20, MemoryCategory::kGatheredWeights, &b);
  EXPECT_NE(on_b.data(), first) << "a block freed on stream a must not go to stream b";
  Buffer on_a = *f.allocator->Allocate(8 << 20, MemoryCategory::kGatheredWeights, &a);
  EXPECT_EQ(on_a.data(), first) << "stream a reuses its own block without synchronising";
  EXPECT_EQ(f.counters.syncs, 0);
}

TEST(CachingAllocatorTest, RecordStreamDelaysReuseUntilOtherStreamFinishes) {
  // The streams outlive the allocator, whose destructor synchronises them.
  FakeStream compute("compute");
  FakeStream comm("comm");
  Fixture f;
  f.counters.streams = {&compute, &comm};
  void* first = nullptr;
  {
    Buffer x = *f.allocator->Allocate(4 << 20, MemoryCategory::kCommBuffers, &compute);
    first = x.data();
    ASSERT_TRUE(f.allocator->RecordStream(x, comm).ok());
    comm.issued = 1;  // the comm stream still has work that reads x
  }
  EXPECT_EQ(f.allocator->stats().pending_blocks, 1);
  Buffer y = *f.allocator->Allocate(4 << 20, MemoryCategory::kCommBuffers, &compute);
  EXPECT_NE(y.data(), first) << "reused while another stream may still read it";
  const int maps = f.counters.maps;
  comm.completed = 1;  // the comm stream's work is done: the first block is free again
  Buffer z = *f.allocator->Allocate(4 << 20, MemoryCategory::kCommBuffers, &compute);
  EXPECT_EQ(z.data(), first);
  EXPECT_EQ(f.counters.maps, maps);
  EXPECT_EQ(f.allocator->stats().pending_blocks, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesCacheThenReportsCategory) {
  Fixture f;
  f.counters.capacity = 16 << 20;
  { Buffer a = *f.allocator->Allocate(10 << 20, MemoryCategory::kParameters, nullptr); }
  // The cached 10 MiB segment cannot serve 12 MiB and leaves no room for a new segment: the
  // allocator returns the cache to the system and retries.
  StatusOr<Buffer> b = f.allocator->Allocate(12 << 20, MemoryCategory::kGradients, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(f.counters.unmaps, 1);
  b->Reset();
  StatusOr<Buffer> c = f.allocator->Allocate(64 << 20, MemoryCategory::kOptimizerState, nullptr);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("optimizer_state"), std::string_view::npos) << c.status();
  EXPECT_NE(c.status().message().find("fake device is full"), std::string_view::npos);
}

TEST(CachingAllocatorTest, CpuCachingAllocatorWorks) {
  MemoryTracker tracker;
  std::unique_ptr<Allocator> a = MakeCpuCachingAllocator(&tracker);
  Buffer b = *a->Allocate(12345, MemoryCategory::kParameters, nullptr);
  std::memset(b.data(), 7, 12345);
  EXPECT_EQ(b.tier(), MemoryTier::kDevice);
  EXPECT_EQ(tracker.Usage(MemoryTier::kDevice, MemoryCategory::kParameters).current, 12345);
  TensorView v = b.View(DType::kF32, {3, 1000});
  EXPECT_EQ(v.numel(), 3000);
}

}  // namespace
}  // namespace zerort
