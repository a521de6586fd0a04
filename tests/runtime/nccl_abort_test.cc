// [Note: an NCCL communicator is aborted at most once] (runtime/nccl_communicator.cc), on a GPU:
// a collective of another group times out (two loopback ranks, one of which never comes), so the
// watchdog aborts every registered communicator, the NCCL one among them. Later NCCL calls fail
// with kAborted saying so, a second abort is a no-op, and destroying the communicator does not
// touch the freed one (it used to finalise and destroy it after the abort: a crash in place of
// the report). Skipped without a GPU. (A first version held the NCCL collective itself behind a
// host function blocking its stream: on an H200 the watchdog's probe then never returned.)
#include <chrono>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/nccl_communicator.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {
namespace {

using ::testing::HasSubstr;

TEST(NcclAbortTest, WatchdogAbortIsFinalAndDestroysCleanly) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  std::mutex mu;
  std::string report;
  Watchdog::Options wo;
  wo.poll_interval = std::chrono::milliseconds(20);
  wo.on_timeout = [&](const std::string& r) {
    std::lock_guard lock(mu);
    report = r;
  };
  Watchdog watchdog(wo);
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto boot = *CreateLoopbackGroup(1, o, nullptr);
  StatusOr<std::unique_ptr<Communicator>> nccl =
      CreateNcclCommunicator(*boot[0], Device::Cuda(0), o, &watchdog);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  auto stream = *CreateStream(Device::Cuda(0), "comm");
  auto allocator = *MakeCudaCachingAllocator(Device::Cuda(0), nullptr);
  Buffer buffer = *allocator->Allocate(4096, MemoryCategory::kCommBuffers, stream.get());
  ASSERT_TRUE(
      (*nccl)
          ->AllReduce(buffer.data(), buffer.data(), 1024, DType::kF32, ReduceOp::kSum, stream.get())
          .ok());
  ASSERT_TRUE(stream->Synchronize().ok());

  // A barrier of two loopback ranks that rank 1 never joins: overdue after 300 ms.
  CommOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  auto pair = *CreateLoopbackGroup(2, quick, &watchdog);
  std::thread lonely([&] { pair[0]->Barrier().IgnoreError(); });
  for (int i = 0; i < 250; ++i) {
    {
      std::lock_guard lock(mu);
      if (!report.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  lonely.join();
  {
    std::lock_guard lock(mu);
    EXPECT_THAT(report, HasSubstr("barrier"));
  }
  const Status after = (*nccl)->AllReduce(buffer.data(), buffer.data(), 1024, DType::kF32,
                                          ReduceOp::kSum, stream.get());
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(after.message(), HasSubstr("watchdog aborted"));
  EXPECT_EQ((*nccl)->Barrier().code(), absl::StatusCode::kAborted);
  nccl->reset();  // must not finalise or destroy the aborted communicator
  pair.clear();
}

}  // namespace
}  // namespace zerort
