// The offload tier's pieces: task pool, staging pool, transfer engine and the NVMe store with
// both engines (io_uring and pread/pwrite), its alignment rules, faults and accounting.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "zerort/offload/nvme_store.h"
#include "zerort/offload/staging_pool.h"
#include "zerort/offload/task_pool.h"
#include "zerort/offload/transfer_engine.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("zerort_offload_test." + std::to_string(::getpid()) + "." +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  bool empty() const { return fs::is_empty(path_); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// 4 KiB-aligned host memory.
struct Aligned {
  explicit Aligned(size_t bytes) : bytes(bytes) {
    p = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  }
  ~Aligned() { std::free(p); }
  char* p;
  size_t bytes;
};

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

std::vector<char> ReadFile(int fd, int64_t offset, size_t n) {
  const int raw = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY);
  EXPECT_GE(raw, 0);
  std::vector<char> out(n);
  EXPECT_EQ(::pread(raw, out.data(), n, offset), static_cast<ssize_t>(n));
  ::close(raw);
  return out;
}

TEST(TaskPool, RunsInOrderAndReturnsStatus) {
  TaskPool pool(1);
  std::vector<int> order;
  std::vector<Task> tasks;
  for (int i = 0; i < 5; ++i) {
    tasks.push_back(pool.Submit([&order, i]() -> Status {
      order.push_back(i);
      return i == 3 ? absl::InternalError("task 3") : absl::OkStatus();
    }));
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tasks[i].Wait().ok(), i != 3);
  EXPECT_EQ(tasks[3].Wait().message(), "task 3");  // Wait is repeatable
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(Task().Wait().ok());
}

TEST(StagingPool, ReusesABufferOnlyAfterItsFences) {
  MemoryTracker tracker;
  HostAllocator host({.alignment = 64, .tier = MemoryTier::kPinnedHost, .tracker = &tracker});
  auto pool = *StagingPool::Create(host, 2, 10000);
  EXPECT_EQ(pool->buffer_bytes(), 12288u);  // rounded to 4 KiB
  EXPECT_GE(tracker.Usage(MemoryTier::kPinnedHost, MemoryCategory::kStaging).current, 2 * 12288);
  auto a = *pool->Acquire();
  auto b = *pool->Acquire();
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 4096, 0u);
  std::atomic<bool> finished{false};
  TaskPool slow(1);
  Task t = slow.Submit([&]() -> Status {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finished = true;
    return absl::OkStatus();
  });
  pool->Return(a, {[t] { return t.Wait(); }});
  pool->Return(b);
  auto again = *pool->Acquire();  // FIFO: a's buffer, only once its fence is done
  EXPECT_EQ(again.data, a.data);
  EXPECT_TRUE(finished.load());
  pool->Return(again, {[] { return absl::DataLossError("fence failed"); }});
  auto next = *pool->Acquire();  // b
  EXPECT_EQ(next.data, b.data);
  StatusOr<StagingPool::Lease> failed = pool->Acquire();
  EXPECT_EQ(failed.status().message(), "fence failed");
  EXPECT_TRUE(pool->Acquire().ok());  // the fence is consumed: the buffer is usable again
}

TEST(TransferEngine, CpuCopiesOverlapOnAWorkerThread) {
  auto engine = *TransferEngine::Create(Device::Cpu());
  std::vector<float> src(1 << 20), dst(1 << 20, 0.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  Transfer t = *engine->StartCopy(dst.data(), Device::Cpu(), src.data(), Device::Cpu(),
                                  src.size() * 4, nullptr);
  ASSERT_TRUE(t.Finish().ok());
  ASSERT_TRUE(t.Finish().ok());  // idempotent
  EXPECT_EQ(dst, src);
  // A stream ordered after a copy sees the copied bytes (a CPU stream: the host waits).
  std::vector<float> again(src.size(), 0.0f);
  auto stream = *CreateStream(Device::Cpu(), "compute");
  Transfer u = *engine->StartCopy(again.data(), Device::Cpu(), src.data(), Device::Cpu(),
                                  src.size() * 4, nullptr);
  ASSERT_TRUE(u.OrderBefore(*stream).ok());
  EXPECT_EQ(again, src);
}

// The io_uring engine's tests skip, saying why, where the kernel refuses io_uring (ENOSYS or
// EPERM: IoUringUsable); engine auto then takes the threads engine, tested everywhere.
std::string IoUringSkip() {
  const Status uring = IoUringUsable();
  return uring.ok() ? ""
                    : StrCat("io_uring is refused on this machine (", uring.message(),
                             "): the io_uring engine is not tested here");
}

class NvmeStoreTest : public ::testing::TestWithParam<IoEngine> {
 protected:
  void SetUp() override {
    if (GetParam() != IoEngine::kIoUring) return;
    if (const std::string why = IoUringSkip(); !why.empty()) GTEST_SKIP() << why;
  }
  NvmeStoreOptions Options() {
    NvmeStoreOptions o;
    o.dir = dir_.str();
    o.engine = GetParam();
    o.tracker = &tracker_;
    return o;
  }
  TempDir dir_;
  MemoryTracker tracker_;
};

TEST_P(NvmeStoreTest, WhatIsWrittenReadsBackExactlyAndNothingStaysOnDisk) {
  NvmeStoreOptions o = Options();
  o.block_bytes = 8192;  // many blocks per request
  o.queue_depth = 3;
  auto store = *NvmeStore::Create(o);
  EXPECT_EQ(store->engine(), GetParam());
  EXPECT_TRUE(dir_.empty()) << "the file is unlinked at once";
  const int64_t n = 300'001;  // not a multiple of 4 KiB
  NvmeRegion a = *store->Reserve(n, MemoryCategory::kOptimizerState);
  NvmeRegion b = *store->Reserve(4096, MemoryCategory::kParameters);
  EXPECT_EQ(a.capacity % 4096, 0);
  EXPECT_EQ(b.offset, a.capacity);
  EXPECT_EQ(tracker_.Usage(MemoryTier::kNvme, MemoryCategory::kOptimizerState).current, n);
  const std::vector<char> data = RandomBytes(n, 7);
  Aligned out(a.capacity), in(a.capacity);
  std::copy(data.begin(), data.end(), out.p);
  IoHandle w = store->StartWrite(a, 0, out.p, n);
  ASSERT_TRUE(w.Finish().ok());
  ASSERT_TRUE(w.Finish().ok());
  IoHandle r = store->StartRead(a, 0, in.p, n);
  ASSERT_TRUE(r.Finish().ok());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), in.p));
  // A part at an aligned offset inside the region.
  IoHandle part = store->StartRead(a, 8192, in.p, 5000);
  ASSERT_TRUE(part.Finish().ok());
  EXPECT_TRUE(std::equal(data.begin() + 8192, data.begin() + 8192 + 5000, in.p));
  store.reset();
  EXPECT_TRUE(dir_.empty());
  EXPECT_EQ(tracker_.InUse(MemoryTier::kNvme).current, 0);
  EXPECT_EQ(tracker_.Usage(MemoryTier::kNvme, MemoryCategory::kOptimizerState).peak, n);
}

TEST_P(NvmeStoreTest, ManyRequestsInFlightCompleteIndependently) {
  NvmeStoreOptions o = Options();
  o.block_bytes = 4096;
  o.queue_depth = 2;
  o.single_submit = true;
  o.overlap_events = false;
  o.thread_count = 3;
  auto store = *NvmeStore::Create(o);
  constexpr int kRequests = 16;
  constexpr int64_t kBytes = 64 << 10;
  std::vector<NvmeRegion> regions;
  std::vector<std::unique_ptr<Aligned>> bufs;
  std::vector<IoHandle> handles;
  for (int i = 0; i < kRequests; ++i) {
    regions.push_back(*store->Reserve(kBytes, MemoryCategory::kParameters));
    bufs.push_back(std::make_unique<Aligned>(kBytes));
    std::vector<char> d = RandomBytes(kBytes, 100 + i);
    std::copy(d.begin(), d.end(), bufs.back()->p);
    handles.push_back(store->StartWrite(regions[i], 0, bufs[i]->p, kBytes));
  }
  for (IoHandle& h : handles) ASSERT_TRUE(h.Finish().ok());
  handles.clear();
  std::vector<std::unique_ptr<Aligned>> back;
  for (int i = kRequests - 1; i >= 0; --i) {  // reverse order
    back.push_back(std::make_unique<Aligned>(kBytes));
    handles.push_back(store->StartRead(regions[i], 0, back.back()->p, kBytes));
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(handles[i].Finish().ok());
    const int r = kRequests - 1 - i;
    EXPECT_EQ(std::memcmp(back[i]->p, bufs[r]->p, kBytes), 0) << "request " << r;
  }
}

TEST_P(NvmeStoreTest, MisalignedOrOutOfRegionRequestsAreRefused) {
  auto store = *NvmeStore::Create(Options());
  NvmeRegion a = *store->Reserve(8192, MemoryCategory::kParameters);
  Aligned buf(16384);
  EXPECT_EQ(store->StartRead(a, 100, buf.p, 4096).Finish().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartRead(a, 0, buf.p + 1, 4096).Finish().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartWrite(a, 4096, buf.p, 8192).Finish().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartWrite(a, 0, buf.p, 0).Finish().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(NvmeStoreTest, AnInjectedFaultNamesTheFileAndTheOthersStillWork) {
  NvmeStoreOptions o = Options();
  o.fail_request = 2;
  o.fail_errno = ENOSPC;
  auto store = *NvmeStore::Create(o);
  NvmeRegion a = *store->Reserve(4096, MemoryCategory::kParameters);
  Aligned buf(4096);
  std::memset(buf.p, 1, 4096);
  EXPECT_TRUE(store->StartWrite(a, 0, buf.p, 4096).Finish().ok());
  const Status failed = store->StartWrite(a, 0, buf.p, 4096).Finish();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find(store->path()), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("No space left"), std::string::npos) << failed;
  EXPECT_TRUE(store->StartRead(a, 0, buf.p, 4096).Finish().ok());
}

TEST_P(NvmeStoreTest, AReservationTheDiskCannotHoldFailsNamingTheFile) {
  auto store = *NvmeStore::Create(Options());
  StatusOr<NvmeRegion> huge = store->Reserve(int64_t{1} << 55, MemoryCategory::kParameters);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find(store->path()), std::string::npos) << huge.status();
  EXPECT_EQ(tracker_.InUse(MemoryTier::kNvme).current, 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, NvmeStoreTest,
                         ::testing::Values(IoEngine::kIoUring, IoEngine::kThreads),
                         [](const auto& info) { return std::string(IoEngineName(info.param)); });

TEST(NvmeStore, BothEnginesWriteByteIdenticalFiles) {
  if (const std::string why = IoUringSkip(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::vector<char> data = RandomBytes(200'000, 3);
  std::vector<std::vector<char>> files;
  for (IoEngine engine : {IoEngine::kIoUring, IoEngine::kThreads}) {
    auto store = *NvmeStore::Create({.dir = dir.str(), .engine = engine, .block_bytes = 16384});
    NvmeRegion skip = *store->Reserve(4096, MemoryCategory::kParameters);
    NvmeRegion r = *store->Reserve(data.size(), MemoryCategory::kParameters);
    Aligned buf(r.capacity);
    std::memset(buf.p, 0, r.capacity);
    std::copy(data.begin(), data.end(), buf.p);
    ASSERT_TRUE(store->StartWrite(r, 0, buf.p, data.size()).Finish().ok());
    EXPECT_EQ(skip.offset, 0);
    files.push_back(ReadFile(store->fd(), 0, r.offset + r.capacity));
  }
  ASSERT_EQ(files[0].size(), files[1].size());
  EXPECT_TRUE(files[0] == files[1]);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), files[0].begin() + 4096));
}

TEST(NvmeStore, BadDirectoriesAndTooLittleSpaceAreConfigErrors) {
  TempDir dir;
  const std::string file = dir.str() + "/plain";
  { std::ofstream(file) << "x"; }
  for (const std::string& bad : {dir.str() + "/missing", file, std::string()}) {
    StatusOr<std::unique_ptr<NvmeStore>> s = NvmeStore::Create({.dir = bad});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  }
  const Status space = NvmeStore::CheckFreeSpace(dir.str(), int64_t{1} << 60, "the test state");
  EXPECT_EQ(space.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(space.message().find("GiB"), std::string::npos) << space;
  EXPECT_NE(space.message().find(dir.str()), std::string::npos) << space;
  EXPECT_TRUE(NvmeStore::CheckFreeSpace(dir.str(), 4096, "a page").ok());
}

}  // namespace
}  // namespace zerort
