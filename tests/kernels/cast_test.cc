// Cast: the vectorised CPU cast against the scalar reference, bitwise. The CUDA twin is tested
// against the CPU cast in cast_cuda_test.cc (gpu label).
#include "zerort/kernels/cast.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

using testing::RandomFloats;

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

TEST(CastTest, VectorisedMatchesReferenceBitwise) {
  const size_t n = (1 << 18) + 5;  // large enough for the threaded path, uneven
  std::vector<float> input = RandomFloats(n, 11);
  testing::AddSpecialFloats(input);
  for (DType from : kTypes) {
    std::vector<std::byte> src(n * DTypeSize(from));
    internal::CpuCast(input.data(), DType::kF32, src.data(), from, n);
    for (DType to : kTypes) {
      std::vector<std::byte> fast(n * DTypeSize(to), std::byte{0x5a});
      std::vector<std::byte> ref(n * DTypeSize(to), std::byte{0xa5});
      TensorView s(src.data(), from, {static_cast<int64_t>(n)});
      ASSERT_TRUE(Cast(s, TensorView(fast.data(), to, {static_cast<int64_t>(n)}), nullptr).ok());
      ASSERT_TRUE(CastReference(s, TensorView(ref.data(), to, {static_cast<int64_t>(n)})).ok());
      ASSERT_EQ(std::memcmp(fast.data(), ref.data(), fast.size()), 0)
          << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST(CastTest, RejectsBadArguments) {
  float a[4];
  uint16_t b[3];
  EXPECT_EQ(Cast(TensorView(a, DType::kF32, {4}), TensorView(b, DType::kBF16, {3}), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Cast(TensorView(a, DType::kI32, {4}), TensorView(a, DType::kF32, {4}), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerort
