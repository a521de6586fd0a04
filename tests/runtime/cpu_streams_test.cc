// [Note: the asynchronous CPU device]: queued CPU streams run their work on their own thread in
// issue order while the host goes on; events order work across streams and the host; errors
// stick; immediate streams keep the synchronous behaviour. Jitter is on wherever ordering is
// checked, so a missing wait would show as a wrong value (and under ThreadSanitizer as a race).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/runtime/comm_test_util.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

StreamOptions Queued(uint64_t seed = 7) {
  return StreamOptions{.cpu = CpuExecution::kQueued, .jitter_seed = seed, .jitter_max_us = 50};
}

std::unique_ptr<Stream> MakeStream(const std::string& name, const StreamOptions& options) {
  StatusOr<std::unique_ptr<Stream>> s = CreateStream(Device::Cpu(), name, options);
  ZR_CHECK_OK(s.status());
  return std::move(*s);
}

std::unique_ptr<Event> MakeEvent() {
  StatusOr<std::unique_ptr<Event>> e = CreateEvent(Device::Cpu());
  ZR_CHECK_OK(e.status());
  return std::move(*e);
}

// A gate the host opens: work that waits on it proves the host went on after issuing.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  // Holds `stream`'s later work until Open().
  Status HoldBack(Stream& stream) {
    return stream.Launch([this] {
      Wait();
      return absl::OkStatus();
    });
  }
};

TEST(CpuStreamsTest, QueuedWorkRunsLaterOnTheStreamsThreadInIssueOrder) {
  auto stream = MakeStream("compute", Queued());
  EXPECT_TRUE(stream->asynchronous());
  Gate gate;
  std::vector<int> order;  // written only by the stream's thread until Synchronize
  std::thread::id worker;
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    gate.Wait();  // blocks the stream, not the host
                    worker = std::this_thread::get_id();
                    order.push_back(0);
                    return absl::OkStatus();
                  })
                  .ok());
  for (int i = 1; i < 50; ++i) {
    ASSERT_TRUE(stream
                    ->Launch([&order, i] {
                      order.push_back(i);
                      return absl::OkStatus();
                    })
                    .ok());
  }
  gate.Open();  // reached only because Launch returned before its work ran
  ASSERT_TRUE(stream->Synchronize().ok());
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(CpuStreamsTest, CopiesAndFillsFollowTheStreamsOrder) {
  auto stream = MakeStream("copy", Queued());
  std::vector<int> a(4096, 1), b(4096, 0);
  Gate gate;
  ASSERT_TRUE(gate.HoldBack(*stream).ok());
  ASSERT_TRUE(FillZero(a.data(), Device::Cpu(), a.size() * sizeof(int), stream.get()).ok());
  ASSERT_TRUE(CopyBytes(b.data(), Device::Cpu(), a.data(), Device::Cpu(), a.size() * sizeof(int),
                        stream.get())
                  .ok());
  EXPECT_EQ(a[0], 1) << "the fill waits behind the gate";
  gate.Open();
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(a[4095], 0);
  EXPECT_EQ(b[0], 0);
}

// CopyFromHostNow takes its source when called: the caller refills it at once (the trainer's
// token vectors, reused for the next micro-batch) and the queued copy still writes the old bytes;
// a CopyBytes from the same vector would read the new ones (what the asynchronous device's parity
// test caught once the host stopped waiting for the stream between micro-batches).
TEST(CpuStreamsTest, CopyFromHostNowTakesTheBytesWhenIssued) {
  auto stream = MakeStream("copy", Queued());
  std::vector<int> src(1024, 7), now(1024, 0), later(1024, 0);
  Gate gate;
  ASSERT_TRUE(gate.HoldBack(*stream).ok());
  ASSERT_TRUE(
      CopyFromHostNow(now.data(), Device::Cpu(), src.data(), src.size() * sizeof(int), stream.get())
          .ok());
  ASSERT_TRUE(CopyBytes(later.data(), Device::Cpu(), src.data(), Device::Cpu(),
                        src.size() * sizeof(int), stream.get())
                  .ok());
  std::fill(src.begin(), src.end(), 9);  // refilled while both copies wait behind the gate
  gate.Open();
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(now[0], 7);
  EXPECT_EQ(now[1023], 7);
  EXPECT_EQ(later[0], 9);
}

TEST(CpuStreamsTest, AnEventOrdersWorkAcrossStreams) {
  // The producer writes after a delay; the consumer, told to wait for the producer's event,
  // must see every write. Repeated with jitter, so that a wait that did not wait would be seen.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    auto producer = MakeStream("producer", Queued(seed));
    auto consumer = MakeStream("consumer", Queued(seed));
    auto ready = MakeEvent();
    std::vector<int> data(256, 0);
    long seen = -1;
    for (int round = 1; round <= 3; ++round) {
      ASSERT_TRUE(producer
                      ->Launch([&data, round] {
                        std::this_thread::sleep_for(std::chrono::microseconds(200));
                        for (int& x : data) x = round;
                        return absl::OkStatus();
                      })
                      .ok());
      ASSERT_TRUE(ready->Record(*producer).ok());
      ASSERT_TRUE(consumer->WaitEvent(*ready).ok());
      ASSERT_TRUE(consumer
                      ->Launch([&data, &seen, round] {
                        long sum = 0;
                        for (int x : data) sum += x;
                        seen = sum == 256L * round ? round : -1;
                        return absl::OkStatus();
                      })
                      .ok());
      ASSERT_TRUE(consumer->Synchronize().ok());
      EXPECT_EQ(seen, round) << "seed " << seed;
    }
  }
}

// Stream::TakeWaits: a queued stream records when its work waited for another stream's event,
// with that stream's name (the exposed-communication metric's input); waits on its own events
// and immediate streams record nothing, and a take empties the record.
TEST(CpuStreamsTest, AQueuedStreamMeasuresItsWaitsOnOtherStreams) {
  auto comm = MakeStream("comm", Queued(0));
  auto compute = MakeStream("compute", Queued(0));
  auto done = MakeEvent();
  ASSERT_TRUE(comm->Launch([] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(60));
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(done->Record(*comm).ok());
  ASSERT_TRUE(compute->WaitEvent(*done).ok());
  auto own = MakeEvent();
  ASSERT_TRUE(own->Record(*compute).ok());
  ASSERT_TRUE(compute->WaitEvent(*own).ok());
  ASSERT_TRUE(compute->Synchronize().ok());
  const std::vector<StreamWait> waits = compute->TakeWaits();
  ASSERT_EQ(waits.size(), 1u) << "not its own event";
  EXPECT_EQ(waits[0].recorder, "comm");
  const double waited = std::chrono::duration<double>(waits[0].end - waits[0].begin).count();
  EXPECT_GE(waited, 0.04);
  EXPECT_LT(waited, 5.0);
  EXPECT_TRUE(compute->TakeWaits().empty()) << "taken";
  EXPECT_TRUE(comm->TakeWaits().empty());
  EXPECT_TRUE(MakeStream("host", {})->TakeWaits().empty());
}

TEST(CpuStreamsTest, TheHostWaitsForAnEventOrAStream) {
  auto stream = MakeStream("compute", Queued());
  auto done = MakeEvent();
  EXPECT_TRUE(*done->Query()) << "never recorded: complete";
  Gate gate;
  std::atomic<bool> ran{false};
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    gate.Wait();
                    ran = true;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(done->Record(*stream).ok());
  EXPECT_FALSE(*done->Query()) << "the stream has not reached the record";
  gate.Open();
  ASSERT_TRUE(done->Synchronize().ok());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(*done->Query());
  // An immediate stream's next work runs on the host: WaitEvent waits there.
  auto immediate = MakeStream("host", StreamOptions{});
  EXPECT_FALSE(immediate->asynchronous());
  Gate second;
  std::atomic<bool> later{false};
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    second.Wait();
                    later = true;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(done->Record(*stream).ok());
  std::thread opener([&] { second.Open(); });
  ASSERT_TRUE(immediate->WaitEvent(*done).ok());
  EXPECT_TRUE(later);
  opener.join();
}

TEST(CpuStreamsTest, AFailedItemsErrorSticksAndMarkersStillRun) {
  auto stream = MakeStream("compute", Queued());
  auto after = MakeEvent();
  bool ran_after = false;
  ASSERT_TRUE(stream->Launch([] { return absl::InternalError("kernel failed"); }).ok());
  (void)stream->Launch([&] {
    ran_after = true;
    return absl::OkStatus();
  });
  ASSERT_TRUE(after->Record(*stream).ok());
  ASSERT_TRUE(after->Synchronize().ok()) << "the marker ran: nothing waits forever";
  const Status st = stream->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(st.message()).find("on stream 'compute': kernel failed"), std::string::npos)
      << st;
  EXPECT_FALSE(ran_after) << "work after a failure is skipped";
  EXPECT_EQ(stream->Launch([] { return absl::OkStatus(); }).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(stream->Synchronize().code(), absl::StatusCode::kInternal) << "sticky";
}

TEST(CpuStreamsTest, ImmediateStreamsRunAtIssueAndDestroyingAQueuedOneRunsWhatWasIssued) {
  auto immediate = MakeStream("host", StreamOptions{});
  int x = 0;
  ASSERT_TRUE(immediate
                  ->Launch([&] {
                    x = 1;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(x, 1);
  std::atomic<int> count{0};
  {
    auto queued = MakeStream("short-lived", Queued());
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(queued
                      ->Launch([&] {
                        ++count;
                        return absl::OkStatus();
                      })
                      .ok());
    }
  }
  EXPECT_EQ(count, 10);
}

TEST(CpuStreamsTest, TheCachingAllocatorParksABlockUntilAnotherStreamHasReadIt) {
  // The CUDA allocator's stream-ordered rule, run by the same code over real CPU events: a block
  // also used on stream B is not handed out again until B has passed its free.
  auto a = MakeStream("compute", Queued());
  auto b = MakeStream("comm", Queued());
  std::unique_ptr<Allocator> allocator = MakeCpuCachingAllocator(nullptr);
  auto* caching = dynamic_cast<CachingAllocator*>(allocator.get());
  ASSERT_NE(caching, nullptr);
  StatusOr<Buffer> used = allocator->Allocate(4096, MemoryCategory::kWorkspace, a.get());
  ASSERT_TRUE(used.ok());
  void* const address = used->data();
  ASSERT_TRUE(allocator->RecordStream(*used, *b).ok());
  used->as<int>()[0] = 7;
  Gate gate;
  std::atomic<int> read{0};
  const int* p = used->as<int>();
  ASSERT_TRUE(b->Launch([&gate, &read, p] {
                 gate.Wait();
                 read = p[0];  // B still reads the block after the host freed it
                 return absl::OkStatus();
               }).ok());
  used->Reset();
  EXPECT_EQ(caching->stats().pending_blocks, 1) << "parked until B reaches the free";
  StatusOr<Buffer> other = allocator->Allocate(4096, MemoryCategory::kWorkspace, a.get());
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->data(), address) << "a parked block is not handed out";
  gate.Open();
  ASSERT_TRUE(b->Synchronize().ok());
  StatusOr<Buffer> again = allocator->Allocate(4096, MemoryCategory::kWorkspace, a.get());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(caching->stats().pending_blocks, 0) << "B has passed the free: back in A's pool";
  EXPECT_EQ(again->data(), address);
  EXPECT_EQ(read, 7);
}

// Runs `check` (a testing::Check... of comm_test_util.h) on loopback groups of 2 and 4 ranks,
// for jitter seeds 1..seeds; every rank must return "".
void ExpectOnLoopbackRanks(uint64_t seeds,
                           const std::function<std::string(Communicator&, uint64_t)>& check) {
  for (int size : {2, 4}) {
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      std::vector<std::string> errors(size);
      CommOptions options;
      options.timeout = std::chrono::seconds(60);
      ASSERT_TRUE(RunLoopbackRanks(size, options, nullptr, [&](Communicator& comm) {
                    errors[comm.rank()] = check(comm, seed);
                    return absl::OkStatus();
                  }).ok());
      for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << size << " ranks, seed " << seed;
    }
  }
}

TEST(CpuStreamsTest, LoopbackCollectivesRunOnEachRanksQueuedStreamInOrder) {
  // The ranks meet on their comm streams' threads.
  ExpectOnLoopbackRanks(4, testing::CheckQueuedCollectives);
}

TEST(CpuStreamsTest, OneCommunicatorsOperationsRunInIssueOrderAcrossStreams) {
  // [Note: one communicator, one order]: without it the even ranks' first all-reduce (behind
  // slow work) pairs with the odd ranks' second.
  ExpectOnLoopbackRanks(3, testing::CheckIssueOrderAcrossStreams);
}

// A collective queued behind work that fails is skipped (the stream's error sticks) and still
// passes its turn on: the host's next collective on that communicator runs instead of waiting
// for it forever.
TEST(CpuStreamsTest, ASkippedQueuedCollectiveGivesItsTurnUp) {
  auto comms = *CreateLoopbackGroup(1, {}, nullptr);
  Communicator& comm = *comms[0];
  auto stream = MakeStream("comm", Queued());
  ASSERT_TRUE(stream
                  ->Launch([] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    return absl::InternalError("broken kernel");
                  })
                  .ok());
  std::vector<float> a(16, 1.0f), b(16, 2.0f);
  ASSERT_TRUE(
      comm.AllReduce(a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum, stream.get()).ok());
  EXPECT_TRUE(comm.AllReduce(b.data(), b.data(), b.size(), DType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(stream->Synchronize().code(), absl::StatusCode::kInternal);
}

// A collective issued on a queued stream runs later on the stream's thread, after the host has
// relabelled the communicator: its trace record (what the watchdog reports) and its span keep
// the label it was issued with.
TEST(CpuStreamsTest, AQueuedCollectiveKeepsTheLabelItWasIssuedWith) {
  std::vector<std::string> errors(2);
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  ASSERT_TRUE(RunLoopbackRanks(2, options, nullptr, [&](Communicator& comm) {
                std::vector<std::string> spans;
                std::mutex mu;
                comm.recorder().SetSpanSink(
                    std::make_shared<const CollectiveSpanSink>([&](const CollectiveSpan& span) {
                      std::lock_guard lock(mu);
                      spans.emplace_back(span.label);
                    }));
                auto stream = MakeStream("comm", Queued(static_cast<uint64_t>(comm.rank()) + 3));
                std::vector<float> a(64, 1.0f), b(64, 2.0f);
                comm.recorder().SetLabel("first");
                ZR_RETURN_IF_ERROR(comm.AllReduce(a.data(), a.data(), a.size(), DType::kF32,
                                                  ReduceOp::kSum, stream.get()));
                comm.recorder().SetLabel("second");
                ZR_RETURN_IF_ERROR(comm.AllReduce(b.data(), b.data(), b.size(), DType::kF32,
                                                  ReduceOp::kSum, stream.get()));
                comm.recorder().SetLabel("");
                ZR_RETURN_IF_ERROR(stream->Synchronize());
                comm.recorder().SetSpanSink(nullptr);
                std::vector<std::string> records;
                for (const CollectiveRecord& r : comm.recorder().trace().Records()) {
                  if (r.op == CollectiveOp::kAllReduce) records.push_back(r.label);
                }
                const std::vector<std::string> want = {"first", "second"};
                if (records != want || spans != want) {
                  errors[comm.rank()] = StrCat("records: ", absl::StrJoin(records, ","),
                                               "; spans: ", absl::StrJoin(spans, ","));
                }
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(CpuStreamsDeathTest, WorkThatSynchronizesItsOwnStreamIsABug) {
  EXPECT_DEATH(
      {
        auto stream = MakeStream("compute", Queued(0));
        Stream* s = stream.get();
        (void)stream->Launch([s] { return s->Synchronize(); });
        (void)stream->Synchronize();
      },
      "synchronized from its own work");
}

}  // namespace
}  // namespace zerort
