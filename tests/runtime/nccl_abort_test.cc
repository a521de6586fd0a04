// [Note: an NCCL communicator is aborted at most once] (runtime/nccl_communicator.cc), on a GPU: a
// one-rank NCCL all-reduce held behind a stream that a host function blocks never completes; the
// watchdog reports it and aborts the communicator; later calls fail with kAborted saying so; and
// destroying the communicator does not touch the freed one (it used to finalise and destroy it
// after the abort: a crash in place of the report). Its own program: a failure here may leave the
// CUDA context unusable. Skipped without a GPU.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/loopback_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/watchdog.h"

namespace zerort {
namespace {

using ::testing::HasSubstr;

void CUDART_CB WaitForRelease(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(NcclAbortTest, TimeoutAbortsOnceReportsAndDestroysCleanly) {
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
  o.timeout = std::chrono::milliseconds(500);
  auto boot = *CreateLoopbackGroup(1, o, nullptr);
  StatusOr<std::unique_ptr<Communicator>> nccl =
      CreateNcclCommunicator(*boot[0], Device::Cuda(0), o, &watchdog);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  auto stream = *CreateStream(Device::Cuda(0), "comm");
  auto allocator = *MakeCudaCachingAllocator(Device::Cuda(0), nullptr);
  Buffer buffer = *allocator->Allocate(4096, MemoryCategory::kCommBuffers, stream.get());

  std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream->native_handle()), WaitForRelease,
                               &release),
            cudaSuccess);
  ASSERT_TRUE((*nccl)
                  ->AllReduce(buffer.data(), buffer.data(), 1024, DType::kF32, ReduceOp::kSum,
                              stream.get())
                  .ok());
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lock(mu);
      if (!report.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard lock(mu);
    EXPECT_THAT(report, HasSubstr("all_reduce"));
    EXPECT_THAT(report, HasSubstr("timed out"));
  }
  const Status after = (*nccl)->AllReduce(buffer.data(), buffer.data(), 1024, DType::kF32,
                                          ReduceOp::kSum, stream.get());
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(after.message(), HasSubstr("watchdog aborted"));
  EXPECT_EQ((*nccl)->Barrier().code(), absl::StatusCode::kAborted);
  release = true;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream->native_handle()));
  cudaGetLastError();
  nccl->reset();  // finalise and destroy must not run on the aborted communicator
  SUCCEED();
}

}  // namespace
}  // namespace zerort
