// The CUDA cast against the CPU cast, bitwise, on fresh random inputs with infinities and NaN
// payloads (gpu label); skipped with the reason when no GPU is present.
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/cast.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

using testing::RandomFloats;

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CastCudaTest, CudaMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  const Device gpu = Device::Cuda(0);
  std::unique_ptr<Allocator> allocator = *MakeCudaCachingAllocator(gpu, nullptr);
  std::unique_ptr<Stream> stream = *CreateStream(gpu, "compute");
  const size_t n = (1 << 20) + 3;
  std::vector<float> input = RandomFloats(n, 12);
  testing::AddSpecialFloats(input);
  for (DType from : kTypes) {
    std::vector<std::byte> src(n * DTypeSize(from));
    internal::CpuCast(input.data(), DType::kF32, src.data(), from, n);
    Buffer dsrc = *allocator->Allocate(src.size(), MemoryCategory::kWorkspace, stream.get());
    ASSERT_TRUE(
        CopyBytes(dsrc.data(), gpu, src.data(), Device::Cpu(), src.size(), stream.get()).ok());
    for (DType to : kTypes) {
      std::vector<std::byte> want(n * DTypeSize(to));
      internal::CpuCast(src.data(), from, want.data(), to, n);
      Buffer ddst = *allocator->Allocate(want.size(), MemoryCategory::kWorkspace, stream.get());
      std::vector<std::byte> poison(want.size(), std::byte{0x7f});
      ASSERT_TRUE(
          CopyBytes(ddst.data(), gpu, poison.data(), Device::Cpu(), poison.size(), stream.get())
              .ok());
      ASSERT_TRUE(Cast(TensorView(dsrc.data(), from, {static_cast<int64_t>(n)}, gpu),
                       TensorView(ddst.data(), to, {static_cast<int64_t>(n)}, gpu), stream.get())
                      .ok());
      std::vector<std::byte> got(want.size());
      ASSERT_TRUE(
          CopyBytes(got.data(), Device::Cpu(), ddst.data(), gpu, got.size(), stream.get()).ok());
      ASSERT_TRUE(stream->Synchronize().ok());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
          << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

}  // namespace
}  // namespace zerort
