// bf16/f16 conversions on all 65,536 bit patterns, round-to-nearest-even on every midpoint, and
// f16 against the compiler's IEEE _Float16 conversions as an independent reference.
#include "zerort/runtime/dtype.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace zerort {
namespace {

// Value of a 16-bit float from its fields, in double, computed independently of dtype.h.
double Decode(uint16_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int sign = bits >> 15;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exponent_bits) - 1) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(mantissa, -mantissa_bits), exponent - bias);
  }
  return sign ? -magnitude : magnitude;
}

struct Format {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
};

const Format kFormats[] = {{"bf16", 8, 7, Bf16BitsToFloat, FloatToBf16Bits},
                           {"f16", 5, 10, F16BitsToFloat, FloatToF16Bits}};

TEST(DTypeTest, DecodeAllPatternsExactly) {
  for (const Format& f : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const auto bits = static_cast<uint16_t>(b);
      const double want = Decode(bits, f.exponent_bits, f.mantissa_bits);
      const float got = f.to_float(bits);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << f.name << " " << b;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << f.name << " bits " << b;
        ASSERT_EQ(std::signbit(got), (b >> 15) != 0) << f.name << " bits " << b;
      }
    }
  }
}

TEST(DTypeTest, RoundTripAndNaN) {
  for (const Format& f : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const auto bits = static_cast<uint16_t>(b);
      const float v = f.to_float(bits);
      const uint16_t back = f.from_float(v);
      if (std::isnan(v)) {
        // Quiet NaN of the same sign.
        ASSERT_TRUE(std::isnan(f.to_float(back))) << f.name << " " << b;
        ASSERT_EQ(back >> 15, bits >> 15);
      } else {
        ASSERT_EQ(back, bits) << f.name << " bits " << b;
      }
    }
  }
}

// Between every two adjacent finite values of the same sign: the midpoint rounds to the one with
// an even mantissa, and one float ulp either side of it rounds to the nearer neighbour.
TEST(DTypeTest, MidpointsRoundToNearestEven) {
  for (const Format& f : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const auto lo = static_cast<uint16_t>(b);
      const auto hi = static_cast<uint16_t>(b + 1);
      if ((lo & 0x7fff) == 0x7fff || (hi & 0x8000) != (lo & 0x8000)) continue;
      const float a = f.to_float(lo);
      const float c = f.to_float(hi);
      if (!std::isfinite(a) || !std::isfinite(c)) continue;  // overflow: OverflowAndUnderflow
      const double mid = (static_cast<double>(a) + c) / 2;   // exact in double, and in float
      const auto midf = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(midf), mid);
      const uint16_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_EQ(f.from_float(midf), even) << f.name << " between " << lo << " and " << hi;
      const float below = std::nextafter(midf, a);
      const float above = std::nextafter(midf, c);
      ASSERT_EQ(f.from_float(below), lo) << f.name << " just past " << lo;
      ASSERT_EQ(f.from_float(above), hi) << f.name << " just before " << hi;
    }
  }
}

TEST(DTypeTest, OverflowAndUnderflow) {
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65520.0f), 0x7c00);  // the midpoint to 2^16 ties to even: infinity
  EXPECT_EQ(FloatToF16Bits(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal
  EXPECT_EQ(FloatToF16Bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToF16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16Bits(3.4028235e38f), 0x7f80);  // rounds up past bf16's largest finite
  EXPECT_EQ(FloatToBf16Bits(1e-45f), 0x0000);
  EXPECT_EQ(FloatToBf16Bits(-0.0f), 0x8000);
}

TEST(DTypeTest, F16MatchesCompilerOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = any(rng);
    float v;
    std::memcpy(&v, &u, 4);
    if (std::isnan(v)) continue;
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t ref;
    std::memcpy(&ref, &h, 2);
    ASSERT_EQ(FloatToF16Bits(v), ref) << "input bits " << u;
  }
}

TEST(DTypeTest, NamesAndParsing) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    ASSERT_EQ(*ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("FP16"), DType::kF16);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(ParseDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerort
