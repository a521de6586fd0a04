// The CUDA allocators (gpu label): device and pinned caching allocators, accounting, and no
// cudaMalloc per allocation in steady state. Skipped with the reason when no GPU is present.
#include <cstring>

#include "gtest/gtest.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

// [Note: the GPUs a build runs on] (runtime/cuda_arch.h): the GPU these tests run on is one the
// build's code reaches (else every stream is refused, naming it), and QueryCuda says so with its
// shared memory a block (the flash attention's blocks are checked against it).
TEST(CudaAllocatorTest, TheGpuRunsThisBuildsCode) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  }
  const Status usable = CheckCudaDeviceUsable(0);
  EXPECT_TRUE(usable.ok()) << usable;
  const CudaInfo info = QueryCuda();
  ASSERT_FALSE(info.devices.empty());
  EXPECT_EQ(info.devices[0].unusable_reason, "");
  EXPECT_GE(info.devices[0].shared_memory_per_block, 48 * 1024);  // every CUDA device since 2.0
  const CudaDeviceInfo first = QueryCudaDevice(0);  // the same entry, found by its index
  EXPECT_EQ(first.name, info.devices[0].name);
  EXPECT_EQ(first.total_memory_bytes, info.devices[0].total_memory_bytes);
  EXPECT_EQ(QueryCudaDevice(static_cast<int>(info.devices.size())).name, "");
  StatusOr<Device> chosen = ChooseDevice("cuda", 0);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_TRUE(chosen->is_cuda());
  EXPECT_TRUE(ChooseDevice("", 0)->is_cuda());
}

TEST(CudaAllocatorTest, DeviceAndPinnedAllocatorsWhenAGpuIsPresent) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  }
  MemoryTracker tracker;
  StatusOr<std::unique_ptr<Allocator>> device = MakeCudaCachingAllocator(Device::Cuda(0), &tracker);
  ASSERT_TRUE(device.ok()) << device.status();
  StatusOr<std::unique_ptr<Allocator>> pinned = MakePinnedHostAllocator(&tracker);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  StatusOr<std::unique_ptr<Stream>> stream = CreateStream(Device::Cuda(0), "test");
  ASSERT_TRUE(stream.ok());
  Buffer d = *(*device)->Allocate(1 << 20, MemoryCategory::kGatheredWeights, stream->get());
  Buffer h = *(*pinned)->Allocate(1 << 20, MemoryCategory::kCommBuffers, nullptr);
  std::vector<float> src(1 << 18);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.5f * i;
  ASSERT_TRUE(
      CopyBytes(d.data(), Device::Cuda(0), src.data(), Device::Cpu(), 1 << 20, stream->get()).ok());
  ASSERT_TRUE(
      CopyBytes(h.data(), Device::Cpu(), d.data(), Device::Cuda(0), 1 << 20, stream->get()).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(h.data(), src.data(), 1 << 20), 0);
  EXPECT_EQ(tracker.Usage(MemoryTier::kDevice, MemoryCategory::kGatheredWeights).current, 1 << 20);
  EXPECT_EQ(tracker.Usage(MemoryTier::kPinnedHost, MemoryCategory::kCommBuffers).current, 1 << 20);
  auto* caching = dynamic_cast<CachingAllocator*>(device->get());
  ASSERT_NE(caching, nullptr);
  const int64_t maps = caching->stats().segments_mapped;
  d.Reset();
  for (int i = 0; i < 100; ++i) {
    Buffer again = *(*device)->Allocate(1 << 20, MemoryCategory::kGatheredWeights, stream->get());
  }
  EXPECT_EQ(caching->stats().segments_mapped, maps) << "no cudaMalloc per allocation";
}

}  // namespace
}  // namespace zerort
