// Communicators on CUDA buffers (gpu label): loopback ranks on one GPU (staged through pinned
// memory) and NCCL with one rank; skipped with the reason when no GPU is present.
#include <cstring>

#include "gtest/gtest.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/nccl_communicator.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {
namespace {

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

std::vector<float> Pattern(size_t n, int rank) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 31 + rank * 7) % 101) * 0.125f + 1;
  return v;
}

// AllGather / ReduceScatter / AllReduce on device buffers of `comm`; returns "" when right.
std::string CheckOnDevice(Communicator& comm, Stream& stream, Allocator& allocator) {
  const Device d = stream.device();
  const size_t count = 4099;
  const int n = comm.size();
  std::vector<float> mine = Pattern(count * n, comm.rank());
  Buffer send = *allocator.Allocate(count * n * 4, MemoryCategory::kCommBuffers, &stream);
  Buffer recv = *allocator.Allocate(count * n * 4, MemoryCategory::kCommBuffers, &stream);
  if (!CopyBytes(send.data(), d, mine.data(), Device::Cpu(), count * n * 4, &stream).ok())
    return "copy";
  std::vector<float> got(count * n);
  // All-reduce of the whole buffer.
  if (auto s =
          comm.AllReduce(send.data(), recv.data(), count * n, DType::kF32, ReduceOp::kSum, &stream);
      !s.ok())
    return s.ToString();
  if (!CopyBytes(got.data(), Device::Cpu(), recv.data(), d, count * n * 4, &stream).ok() ||
      !stream.Synchronize().ok())
    return "copy back";
  for (size_t i = 0; i < count * n; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += Pattern(count * n, r)[i];
    if (std::abs(got[i] - want) > 1e-4f * std::abs(want)) return StrCat("all_reduce element ", i);
    if (i > 64) break;
  }
  // All-gather of the first `count` elements of each rank.
  if (auto s = comm.AllGather(send.data(), recv.data(), count, DType::kF32, &stream); !s.ok())
    return s.ToString();
  if (!CopyBytes(got.data(), Device::Cpu(), recv.data(), d, count * n * 4, &stream).ok() ||
      !stream.Synchronize().ok())
    return "copy back";
  for (int r = 0; r < n; ++r) {
    if (std::memcmp(&got[r * count], Pattern(count * n, r).data(), count * 4) != 0) {
      return StrCat("all_gather block ", r);
    }
  }
  return "";
}

TEST(CudaCommTest, LoopbackRanksOnOneGpu) {
  ZR_NEED_GPU();
  std::vector<std::string> errors(2);
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  ASSERT_TRUE(RunLoopbackRanks(2, o, nullptr, [&](Communicator& comm) -> Status {
                ZR_RETURN_IF_ERROR(SetCurrentDevice(Device::Cuda(0)));
                ZR_ASSIGN_OR_RETURN(auto stream, CreateStream(Device::Cuda(0), "comm"));
                ZR_ASSIGN_OR_RETURN(auto allocator,
                                    MakeCudaCachingAllocator(Device::Cuda(0), nullptr));
                errors[comm.rank()] = CheckOnDevice(comm, *stream, *allocator);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(CudaCommTest, NcclWithOneRank) {
  ZR_NEED_GPU();
  Watchdog watchdog({});
  CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto boot = *CreateLoopbackGroup(1, o, nullptr);
  StatusOr<std::unique_ptr<Communicator>> nccl =
      CreateNcclCommunicator(*boot[0], Device::Cuda(0), o, &watchdog);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  auto stream = *CreateStream(Device::Cuda(0), "comm");
  auto allocator = *MakeCudaCachingAllocator(Device::Cuda(0), nullptr);
  EXPECT_EQ(CheckOnDevice(**nccl, *stream, *allocator), "");
  EXPECT_TRUE((*nccl)->Barrier().ok());
  // The probes reported completion to the trace.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const CollectiveRecord& r : (*nccl)->recorder().trace().Records()) {
    if (r.op == CollectiveOp::kBarrier) continue;
    EXPECT_EQ(r.state, CollectiveState::kCompleted) << (*nccl)->recorder().trace().Dump();
  }
  EXPECT_EQ((*nccl)->AllReduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum, nullptr).code(),
            absl::StatusCode::kInvalidArgument)
      << "NCCL needs a CUDA stream";
}

}  // namespace
}  // namespace zerort
