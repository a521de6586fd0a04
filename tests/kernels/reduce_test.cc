// Reductions: the vectorised CPU kernels against double-precision references, and in-place
// scaling, in fp32, bf16 and f16; the model kernels' loss ledger on a queued stream.
#include "zerort/kernels/reduce.h"

#include <cmath>
#include <cstring>
#include <random>

#include <omp.h>

#include "gtest/gtest.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

TEST(ReduceTest, SumOfSquaresAndNonFinite) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = (1 << 20) + 17;
    std::vector<uint32_t> storage(n);
    TensorView x(storage.data(), dtype, {n});
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(storage.data(), dtype, i, d(rng));
    float acc = 1.5f;  // accumulates on top of what is there
    ASSERT_TRUE(SumOfSquares(x, TensorView(&acc, DType::kF32, {1}), nullptr).ok());
    const double want = SumOfSquaresReference(x) + 1.5;
    EXPECT_NEAR(acc, want, 1e-5 * want) << DTypeName(dtype);

    float count = 0;
    ASSERT_TRUE(CountNonFinite(x, TensorView(&count, DType::kF32, {1}), nullptr).ok());
    EXPECT_EQ(count, 0);
    StoreFromFloat(storage.data(), dtype, 5, INFINITY);
    StoreFromFloat(storage.data(), dtype, n - 1, NAN);
    ASSERT_TRUE(CountNonFinite(x, TensorView(&count, DType::kF32, {1}), nullptr).ok());
    EXPECT_EQ(count, 2);
    EXPECT_EQ(CountNonFiniteReference(x), 2);

    const float before = LoadAsFloat(storage.data(), dtype, 1000);
    ASSERT_TRUE(Scale(x, 0.5f, nullptr).ok());
    EXPECT_EQ(LoadAsFloat(storage.data(), dtype, 1000), before * 0.5f);  // exact: power of two
  }
}

TEST(ReduceTest, SumAddsTheScaledSum) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t n = (1 << 17) + 3;  // more than one chunk
    std::vector<uint32_t> storage(n);
    TensorView x(storage.data(), dtype, {n});
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      StoreFromFloat(storage.data(), dtype, i, static_cast<float>(i % 7) - 2.5f);
      want += LoadAsFloat(storage.data(), dtype, i);
    }
    float acc = 2.0f;
    ASSERT_TRUE(Sum(x, 0.25, TensorView(&acc, DType::kF32, {1}), nullptr).ok());
    EXPECT_FLOAT_EQ(acc, static_cast<float>(2.0 + 0.25 * want)) << DTypeName(dtype);
  }
}

// [Note: the training loss ledger]: on a queued, jittered stream the adds run later on the
// stream's thread; TakeLossLedger waits for them, and the sum is the per-call arithmetic's.
TEST(ReduceTest, LossLedgerOnAQueuedStreamIsReadAfterItsAdds) {
  auto stream =
      *CreateStream(Device::Cpu(), "compute",
                    {.cpu = CpuExecution::kQueued, .jitter_seed = 9, .jitter_max_us = 2000});
  std::unique_ptr<ModelKernels> k = MakeCpuModelKernels(CpuPrecision::kFloat, stream.get());
  const std::vector<float> a = {1.5f, 2.25f, -0.5f}, b = {4.0f, 0.125f};
  double want = 0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    ASSERT_TRUE(k->AddToLossLedger(a.data(), 3, 3.0).ok());
    ASSERT_TRUE(k->AddToLossLedger(b.data(), 2, 2.0).ok());
    want += (1.5 + 2.25 - 0.5) / 3.0;
    want += (4.0 + 0.125) / 2.0;
  }
  EXPECT_EQ(*k->TakeLossLedger(), want);
  EXPECT_EQ(*k->TakeLossLedger(), 0.0);  // taken and zeroed
}

// AccumulateInto against the scalar sum, and AssignInto bitwise the add into a zeroed shard
// without reading its destination ([Note: host gradient shards start stale]): -0 lands as +0,
// NaN garbage in the destination does not leak, in each source dtype and across the OpenMP split.
TEST(ReduceTest, AssignIntoIsTheAddIntoZeros) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = (1 << 17) + 5;
    std::vector<uint32_t> storage(n);
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(storage.data(), dtype, i, d(rng));
    StoreFromFloat(storage.data(), dtype, 3, -0.0f);
    StoreFromFloat(storage.data(), dtype, n - 1, -0.0f);
    const TensorView src(storage.data(), dtype, {n});
    std::vector<float> zeroed(n, 0.0f), assigned(n, NAN), added(n);
    for (int64_t i = 0; i < n; ++i) added[i] = 1.25f * static_cast<float>(i % 5);
    std::vector<float> want_added = added;
    for (int64_t i = 0; i < n; ++i) want_added[i] += LoadAsFloat(storage.data(), dtype, i);
    ASSERT_TRUE(AccumulateInto(src, TensorView(zeroed.data(), DType::kF32, {n}), nullptr).ok());
    ASSERT_TRUE(AssignInto(src, TensorView(assigned.data(), DType::kF32, {n}), nullptr).ok());
    ASSERT_TRUE(AccumulateInto(src, TensorView(added.data(), DType::kF32, {n}), nullptr).ok());
    EXPECT_EQ(std::memcmp(zeroed.data(), assigned.data(), n * sizeof(float)), 0)
        << DTypeName(dtype);
    EXPECT_FALSE(std::signbit(assigned[3])) << DTypeName(dtype);
    EXPECT_FALSE(std::signbit(assigned[n - 1])) << DTypeName(dtype);
    EXPECT_EQ(std::memcmp(added.data(), want_added.data(), n * sizeof(float)), 0)
        << DTypeName(dtype);
  }
  float small[2] = {0, 0};
  EXPECT_EQ(
      AssignInto(TensorView(small, DType::kF32, {2}), TensorView(small, DType::kBF16, {2}), nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// [Note: the norm taken by the last add] (sharding/sharded_optimizer.h): the fused add and sum of
// squares is bitwise AccumulateInto (AssignInto) and then SumOfSquares over each range, added
// into a float from 0: whole buffers, none, ranges cut inside chunks, empty ones, many small ones
// (each rounded to float before the next), a non-finite value, one thread and the default.
TEST(ReduceTest, HostAccumulateWithSumOfSquaresIsTheTwoPasses) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const int64_t n = 3 * kReduceChunk + 1234;
  std::vector<std::vector<Range>> cases = {
      {{0, n}},
      {},
      {{0, 100000}, {150000, 150000}, {150001, 3 * kReduceChunk - 5}},
      {{kReduceChunk + 7, n}},
  };
  std::vector<Range> many;
  for (int64_t b = 5; b + 900 < n; b += 4100) many.push_back({b, b + 900});
  cases.push_back(many);
  for (int threads : {1, omp_get_max_threads()}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::vector<uint32_t> storage(n);
      for (int64_t i = 0; i < n; ++i) StoreFromFloat(storage.data(), dtype, i, d(rng));
      const TensorView src(storage.data(), dtype, {n});
      std::vector<float> start(n);
      for (float& v : start) v = d(rng);
      for (bool assign : {false, true}) {
        for (bool infinite : {false, true}) {
          for (const std::vector<Range>& ranges : cases) {
            std::vector<float> two = start, one = start;
            if (infinite) two[n - 3] = one[n - 3] = INFINITY;
            const TensorView two_view(two.data(), DType::kF32, {n});
            ASSERT_TRUE((assign ? AssignInto(src, two_view, nullptr)
                                : AccumulateInto(src, two_view, nullptr))
                            .ok());
            float want = 0.0f;
            for (const Range& r : ranges) {
              ASSERT_TRUE(SumOfSquares(two_view.Flat(r.begin, r.end - r.begin),
                                       TensorView(&want, DType::kF32, {1}), nullptr)
                              .ok());
            }
            const StatusOr<float> got = HostAccumulateWithSumOfSquares(
                src, TensorView(one.data(), DType::kF32, {n}), assign, ranges);
            ASSERT_TRUE(got.ok()) << got.status();
            const std::string what =
                StrCat(DTypeName(dtype), assign ? " assign" : " add", infinite ? " inf" : "", ", ",
                       ranges.size(), " ranges, ", threads, " threads");
            EXPECT_EQ(std::memcmp(one.data(), two.data(), n * sizeof(float)), 0) << what;
            EXPECT_EQ(std::memcmp(&*got, &want, sizeof(float)), 0)
                << what << ": " << *got << " against " << want;
          }
        }
      }
    }
    omp_set_num_threads(saved);
  }
  // Ranges out of order, overlapping or outside the buffer are refused.
  std::vector<float> src(10, 1.0f), dst(10, 0.0f);
  const TensorView s(src.data(), DType::kF32, {10}), t(dst.data(), DType::kF32, {10});
  for (const std::vector<Range>& bad : std::vector<std::vector<Range>>{
           {{5, 8}, {0, 2}}, {{0, 6}, {5, 8}}, {{3, 11}}, {{4, 3}}, {{-1, 2}}}) {
    EXPECT_EQ(HostAccumulateWithSumOfSquares(s, t, false, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ReduceTest, ChecksArguments) {
  float x[4] = {1, 2, 3, 4};
  double wrong = 0;
  EXPECT_EQ(
      SumOfSquares(TensorView(x, DType::kF32, {4}), TensorView(&wrong, DType::kI64, {1}), nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  int32_t ints[2] = {1, 2};
  float out = 0;
  EXPECT_EQ(
      SumOfSquares(TensorView(ints, DType::kI32, {2}), TensorView(&out, DType::kF32, {1}), nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerort
