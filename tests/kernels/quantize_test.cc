// [Note: block quantization] (kernels/quantize.h): DeepSpeed's group sizes, the round trip's
// error bound, the packed layout, zeros and 16-bit inputs.
#include "zerort/kernels/quantize.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/runtime/dtype.h"

namespace zerort {
namespace {

TEST(QuantizeTest, GroupsAreDeepSpeeds) {
  EXPECT_EQ(QuantGroups(16), 1);
  EXPECT_EQ(QuantGroups(8000), 1);
  EXPECT_EQ(QuantGroups(8008), 7);          // 8 x 7 x 11 x 13: from 2 up, the first g with 8g | n
  EXPECT_EQ(QuantGroups(1'000'000), 125);   // 8000 per group
  EXPECT_EQ(QuantGroups(768 * 3072), 384);  // 2^18 x 9: the first 8 x g dividing it from 295
  EXPECT_EQ(QuantGroups(1 << 20), 256);     // 132 -> 256 (2^20 % (8 x 256) == 0), 4096 each
  EXPECT_EQ(QuantizedBytes(1'000'000), 1'000'000 + 4 * 125);
  for (int64_t n : {16, 48, 8008, 65536, 1'000'000, 768 * 3072}) {
    const int64_t g = QuantGroups(n);
    EXPECT_EQ(n % (8 * g), 0) << n;
    EXPECT_LT(n / g, 16000) << n;
  }
}

TEST(QuantizeTest, RoundTripWithinHalfAStepPerGroup) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 24'000;  // 3 groups of 8000
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> storage(static_cast<size_t>(n) * 2);
    void* x = storage.data();
    for (int64_t i = 0; i < n; ++i) {
      // Groups of different scales; the middle group all zeros.
      const int64_t g = i / 8000;
      StoreFromFloat(x, dtype, i, g == 1 ? 0.0f : normal(rng) * (g == 0 ? 0.01f : 30.0f));
    }
    const TensorView in(x, dtype, {n}, Device::Cpu());
    std::vector<char> packed(static_cast<size_t>(QuantizedBytes(n)));
    ASSERT_TRUE(QuantizeInt8(in, packed.data(), nullptr).ok());
    const auto* q = reinterpret_cast<const int8_t*>(packed.data());
    const auto* scales = reinterpret_cast<const float*>(packed.data() + n);
    EXPECT_EQ(scales[1], 1.0f) << "a group of zeros";
    std::vector<uint16_t> out_storage(static_cast<size_t>(n) * 2);
    const TensorView out(out_storage.data(), dtype, {n}, Device::Cpu());
    ASSERT_TRUE(DequantizeInt8(packed.data(), out, nullptr).ok());
    int at_max = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float s = scales[i / 8000];
      const float v = LoadAsFloat(x, dtype, i), back = LoadAsFloat(out.data(), dtype, i);
      ASSERT_GE(q[i], -127);
      at_max += std::abs(q[i]) == 127;
      // Half a quantization step, plus the output dtype's rounding of the product.
      const float rounding = dtype == DType::kF32 ? 1e-6f : std::fabs(back) / 128.0f;
      ASSERT_LE(std::fabs(back - v), s / 2 + rounding) << DTypeName(dtype) << " " << i;
      if (i / 8000 == 1) {
        ASSERT_EQ(back, 0.0f);
      }
    }
    EXPECT_GE(at_max, 2) << "each non-zero group's largest magnitude maps to +-127";
  }
}

TEST(QuantizeTest, RefusesWhatItCannotPack) {
  std::vector<float> x(12);
  std::vector<char> packed(64);
  EXPECT_FALSE(
      QuantizeInt8(TensorView(x.data(), DType::kF32, {12}, Device::Cpu()), packed.data(), nullptr)
          .ok());
  EXPECT_FALSE(
      QuantizeInt8(TensorView(x.data(), DType::kI32, {8}, Device::Cpu()), packed.data(), nullptr)
          .ok());
}

}  // namespace
}  // namespace zerort
