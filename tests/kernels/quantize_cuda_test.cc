// [Note: block quantization] (kernels/quantize.h) on CUDA against the CPU twin, bit for bit: the
// packed bytes (int8 values and fp32 scales) of QuantizeInt8, and DequantizeInt8's output, for
// fp32, bf16 and fp16 inputs at sizes of one, seven, 256 and 384 groups (gpu label); skipped with
// the reason when no GPU is present.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/kernels/cast.h"
#include "zerort/kernels/quantize.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

// Normal values whose scale changes every 5000 elements (so groups differ, and some group
// boundaries fall inside a run of one scale), with a run of zeros and exact ties at +-0.5 steps.
std::vector<float> GroupedValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t run = i / 5000;
    const float scale = run % 4 == 3 ? 0.0f : std::exp2(static_cast<float>(run % 7) * 3 - 9);
    v[static_cast<size_t>(i)] = normal(rng) * scale;
  }
  return v;
}

TEST(QuantizeCudaTest, CudaMatchesCpuBitwise) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  const Device gpu = Device::Cuda(0);
  std::unique_ptr<Allocator> allocator = *MakeCudaCachingAllocator(gpu, nullptr);
  std::unique_ptr<Stream> stream = *CreateStream(gpu, "compute");
  for (int64_t n : {int64_t{16}, int64_t{8008}, int64_t{1} << 20, int64_t{768} * 3072}) {
    const std::vector<float> values = GroupedValues(n, static_cast<uint32_t>(n));
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " n=" + std::to_string(n));
      const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
      const size_t packed_bytes = static_cast<size_t>(QuantizedBytes(n));
      std::vector<std::byte> x(bytes);
      internal::CpuCast(values.data(), DType::kF32, x.data(), dtype, n);
      const TensorView host_x(x.data(), dtype, {n}, Device::Cpu());
      std::vector<std::byte> want(packed_bytes);
      ASSERT_TRUE(QuantizeInt8(host_x, want.data(), nullptr).ok());

      Buffer dx = *allocator->Allocate(bytes, MemoryCategory::kWorkspace, stream.get());
      Buffer dpacked = *allocator->Allocate(packed_bytes, MemoryCategory::kWorkspace, stream.get());
      Buffer dout = *allocator->Allocate(bytes, MemoryCategory::kWorkspace, stream.get());
      ASSERT_TRUE(CopyBytes(dx.data(), gpu, x.data(), Device::Cpu(), bytes, stream.get()).ok());
      ASSERT_TRUE(
          QuantizeInt8(TensorView(dx.data(), dtype, {n}, gpu), dpacked.data(), stream.get()).ok());
      std::vector<std::byte> got(packed_bytes);
      ASSERT_TRUE(
          CopyBytes(got.data(), Device::Cpu(), dpacked.data(), gpu, packed_bytes, stream.get())
              .ok());
      ASSERT_TRUE(stream->Synchronize().ok());
      size_t first = 0;
      while (first < packed_bytes && got[first] == want[first]) ++first;
      ASSERT_EQ(first, packed_bytes) << "packed bytes differ first at byte " << first << " of "
                                     << packed_bytes << " (" << n << " values, then scales)";

      // Dequantize the CPU's bytes on both devices.
      std::vector<std::byte> want_out(bytes), got_out(bytes);
      ASSERT_TRUE(DequantizeInt8(want.data(),
                                 TensorView(want_out.data(), dtype, {n}, Device::Cpu()), nullptr)
                      .ok());
      ASSERT_TRUE(
          DequantizeInt8(dpacked.data(), TensorView(dout.data(), dtype, {n}, gpu), stream.get())
              .ok());
      ASSERT_TRUE(
          CopyBytes(got_out.data(), Device::Cpu(), dout.data(), gpu, bytes, stream.get()).ok());
      ASSERT_TRUE(stream->Synchronize().ok());
      ASSERT_EQ(std::memcmp(got_out.data(), want_out.data(), bytes), 0);
    }
  }
}

}  // namespace
}  // namespace zerort
