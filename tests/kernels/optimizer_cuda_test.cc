// CUDA twins of the optimizer and reduction kernels against the CPU ones, on fresh random
// inputs (gpu label; skipped with the reason when no GPU is present). The optimizers share their
// element arithmetic (kernels/optimizer_math.h, no fused multiply-adds on either device), so
// parameters, moments and compute copies must be bitwise equal.
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "zerort/kernels/lamb.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

struct Gpu {
  Device device = Device::Cuda(0);
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<Stream> stream;
  std::vector<Buffer> buffers;
  Gpu()
      : allocator(*MakeCudaCachingAllocator(device, nullptr)),
        stream(*CreateStream(device, "compute")) {}
  TensorView Upload(const void* host, DType dtype, int64_t n) {
    buffers.push_back(
        *allocator->Allocate(n * DTypeSize(dtype), MemoryCategory::kWorkspace, stream.get()));
    ZR_CHECK_OK(CopyBytes(buffers.back().data(), device, host, Device::Cpu(), n * DTypeSize(dtype),
                          stream.get()));
    return TensorView(buffers.back().data(), dtype, {n}, device);
  }
  void Download(void* host, const TensorView& v) {
    ZR_CHECK_OK(CopyBytes(host, Device::Cpu(), v.data(), device, v.nbytes(), stream.get()));
    ZR_CHECK_OK(stream->Synchronize());
  }
};

std::vector<float> Random(size_t n, uint32_t seed, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = positive ? std::abs(d(rng)) * 0.01f : d(rng);
  return v;
}

// The first index where the two differ bitwise, with both values printed; -1 when none does.
template <typename T>
int64_t FirstDifference(const std::vector<T>& got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << "element " << i << ": cuda " << +got[i] << ", cpu " << +want[i];
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

TEST(OptimizerCudaTest, AdamMatchesCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  const int64_t n = (1 << 20) + 7;
  for (const auto& [decoupled, bias_correction] :
       {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
    std::vector<float> p = Random(n, 1), g = Random(n, 2), m = Random(n, 3), v = Random(n, 4, true);
    std::vector<uint16_t> out(n);
    TensorView dp = gpu.Upload(p.data(), DType::kF32, n), dg = gpu.Upload(g.data(), DType::kF32, n);
    TensorView dm = gpu.Upload(m.data(), DType::kF32, n), dv = gpu.Upload(v.data(), DType::kF32, n);
    TensorView dout = gpu.Upload(out.data(), DType::kBF16, n);
    const AdamHyper h{.lr = 1e-3f,
                      .weight_decay = 0.1f,
                      .decoupled = decoupled,
                      .step = 3,
                      .grad_scale = 0.5f,
                      .bias_correction = bias_correction};
    ASSERT_TRUE(AdamStep(h, dp, dg, dm, dv, dout, gpu.stream.get()).ok());
    ASSERT_TRUE(
        AdamStep(h, TensorView(p.data(), DType::kF32, {n}), TensorView(g.data(), DType::kF32, {n}),
                 TensorView(m.data(), DType::kF32, {n}), TensorView(v.data(), DType::kF32, {n}),
                 TensorView(out.data(), DType::kBF16, {n}), nullptr)
            .ok());
    std::vector<float> gp(n), gm(n), gv(n);
    std::vector<uint16_t> gout(n);
    gpu.Download(gp.data(), dp);
    gpu.Download(gm.data(), dm);
    gpu.Download(gv.data(), dv);
    gpu.Download(gout.data(), dout);
    EXPECT_EQ(FirstDifference(gp, p), -1) << "parameters";
    EXPECT_EQ(FirstDifference(gm, m), -1) << "exp_avg";
    EXPECT_EQ(FirstDifference(gv, v), -1) << "exp_avg_sq";
    EXPECT_EQ(FirstDifference(gout, out), -1) << "bf16 compute copy";
  }
}

// 40 segments (two launches of kAdamSegmentsPerLaunch and the rest) of varied lengths with gaps
// between them and alternating weight decay: the GPU's one launch per 32 segments equals the
// CPU's segment loop bitwise, and the gaps are untouched on both.
TEST(OptimizerCudaTest, AdamSegmentsMatchCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  std::vector<OptimizerSegment> segments;
  int64_t at = 0;
  for (int k = 0; k < 40; ++k) {
    const int64_t count = k % 7 == 0 ? 70001 : 17 * k + 1;
    segments.push_back({.begin = at, .count = count, .weight_decay = k % 2 ? 0.1f : 0.0f});
    at += count + (k % 3);  // gaps of 0-2 elements
  }
  const int64_t n = at + 5;
  std::vector<float> p = Random(n, 11), g = Random(n, 12), m = Random(n, 13),
                     v = Random(n, 14, true);
  std::vector<uint16_t> out(n, 0x7fc1);  // a NaN payload: untouched in the gaps
  TensorView dp = gpu.Upload(p.data(), DType::kF32, n), dg = gpu.Upload(g.data(), DType::kF32, n);
  TensorView dm = gpu.Upload(m.data(), DType::kF32, n), dv = gpu.Upload(v.data(), DType::kF32, n);
  TensorView dout = gpu.Upload(out.data(), DType::kBF16, n);
  const AdamHyper h{.lr = 1e-3f, .step = 5, .grad_scale = 0.25f};
  ASSERT_TRUE(AdamStepSegments(h, segments, dp, dg, dm, dv, dout, gpu.stream.get()).ok());
  ASSERT_TRUE(AdamStepSegments(h, segments, TensorView(p.data(), DType::kF32, {n}),
                               TensorView(g.data(), DType::kF32, {n}),
                               TensorView(m.data(), DType::kF32, {n}),
                               TensorView(v.data(), DType::kF32, {n}),
                               TensorView(out.data(), DType::kBF16, {n}), nullptr)
                  .ok());
  std::vector<float> gp(n), gm(n), gv(n);
  std::vector<uint16_t> gout(n);
  gpu.Download(gp.data(), dp);
  gpu.Download(gm.data(), dm);
  gpu.Download(gv.data(), dv);
  gpu.Download(gout.data(), dout);
  EXPECT_EQ(FirstDifference(gp, p), -1) << "parameters";
  EXPECT_EQ(FirstDifference(gm, m), -1) << "exp_avg";
  EXPECT_EQ(FirstDifference(gv, v), -1) << "exp_avg_sq";
  EXPECT_EQ(FirstDifference(gout, out), -1) << "bf16 compute copy";
  EXPECT_EQ(gout.back(), 0x7fc1) << "a gap was written";
}

TEST(OptimizerCudaTest, SgdMatchesCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  const int64_t n = (1 << 19) + 5;
  std::vector<float> p = Random(n, 5), g = Random(n, 6), b = Random(n, 7);
  TensorView dp = gpu.Upload(p.data(), DType::kF32, n), dg = gpu.Upload(g.data(), DType::kF32, n);
  TensorView db = gpu.Upload(b.data(), DType::kF32, n);
  const SgdHyper h{
      .lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = true, .step = 4};
  ASSERT_TRUE(SgdStep(h, dp, dg, db, TensorView(), gpu.stream.get()).ok());
  ASSERT_TRUE(SgdStep(h, TensorView(p.data(), DType::kF32, {n}),
                      TensorView(g.data(), DType::kF32, {n}),
                      TensorView(b.data(), DType::kF32, {n}), TensorView(), nullptr)
                  .ok());
  std::vector<float> gp(n), gb(n);
  gpu.Download(gp.data(), dp);
  gpu.Download(gb.data(), db);
  EXPECT_EQ(FirstDifference(gp, p), -1) << "parameters";
  EXPECT_EQ(FirstDifference(gb, b), -1) << "momentum buffer";
}

TEST(OptimizerCudaTest, LambMatchesCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  const int64_t n = (1 << 20) + 3;
  std::vector<float> p = Random(n, 11), g = Random(n, 12), m = Random(n, 13);
  std::vector<float> v = Random(n, 14, true);
  std::vector<uint16_t> out(n);
  TensorView dp = gpu.Upload(p.data(), DType::kF32, n), dg = gpu.Upload(g.data(), DType::kF32, n);
  TensorView dm = gpu.Upload(m.data(), DType::kF32, n), dv = gpu.Upload(v.data(), DType::kF32, n);
  TensorView dout = gpu.Upload(out.data(), DType::kBF16, n);
  float zero[2] = {0, 0}, sums[2] = {0, 0}, gsums[2];
  TensorView dsums = gpu.Upload(zero, DType::kF32, 2);
  const LambHyper h{.lr = 2e-3f, .weight_decay = 0.01f, .step = 5, .grad_scale = 0.25f};
  ASSERT_TRUE(LambMoments(h, dp, dg, dm, dv, dsums, gpu.stream.get()).ok());
  ASSERT_TRUE(
      LambMoments(h, TensorView(p.data(), DType::kF32, {n}), TensorView(g.data(), DType::kF32, {n}),
                  TensorView(m.data(), DType::kF32, {n}), TensorView(v.data(), DType::kF32, {n}),
                  TensorView(sums, DType::kF32, {2}), nullptr)
          .ok());
  gpu.Download(gsums, dsums);
  std::vector<float> gg(n), gm(n), gv(n);
  gpu.Download(gg.data(), dg);
  gpu.Download(gm.data(), dm);
  gpu.Download(gv.data(), dv);
  EXPECT_EQ(FirstDifference(gm, m), -1) << "exp_avg";
  EXPECT_EQ(FirstDifference(gv, v), -1) << "exp_avg_sq";
  EXPECT_EQ(FirstDifference(gg, g), -1) << "update";
  // The sums are reduced in another order on each device (CPU: double; GPU: float per thread).
  EXPECT_NEAR(gsums[0], sums[0], 1e-5 * sums[0]);
  EXPECT_NEAR(gsums[1], sums[1], 1e-5 * sums[1]);
  const float coeff = LambCoefficient(h, sums[0], sums[1]);
  ASSERT_TRUE(LambApply(h, coeff, dp, dg, dout, gpu.stream.get()).ok());
  ASSERT_TRUE(LambApply(h, coeff, TensorView(p.data(), DType::kF32, {n}),
                        TensorView(g.data(), DType::kF32, {n}),
                        TensorView(out.data(), DType::kBF16, {n}), nullptr)
                  .ok());
  std::vector<float> gp(n);
  std::vector<uint16_t> gout(n);
  gpu.Download(gp.data(), dp);
  gpu.Download(gout.data(), dout);
  EXPECT_EQ(FirstDifference(gp, p), -1) << "parameters";
  EXPECT_EQ(FirstDifference(gout, out), -1) << "bf16 compute copy";
}

TEST(ReduceCudaTest, SumOfSquaresNonFiniteScaleMatchCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  const int64_t n = (1 << 22) + 3;
  std::vector<float> x = Random(n, 8);
  x[77] = INFINITY;
  TensorView dx = gpu.Upload(x.data(), DType::kF32, n);
  float zero[2] = {0, 0};
  TensorView acc = gpu.Upload(zero, DType::kF32, 1);
  TensorView count = gpu.Upload(zero, DType::kF32, 1);
  ASSERT_TRUE(CountNonFinite(dx, count, gpu.stream.get()).ok());
  float c = 0;
  gpu.Download(&c, count);
  EXPECT_EQ(c, 1);
  x[77] = 0.5f;
  dx = gpu.Upload(x.data(), DType::kF32, n);
  ASSERT_TRUE(SumOfSquares(dx, acc, gpu.stream.get()).ok());
  float s = 0;
  gpu.Download(&s, acc);
  const double want = SumOfSquaresReference(TensorView(x.data(), DType::kF32, {n}));
  EXPECT_NEAR(s, want, 1e-5 * want);
  ASSERT_TRUE(Scale(dx, 0.25f, gpu.stream.get()).ok());
  std::vector<float> back(n);
  gpu.Download(back.data(), dx);
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(back[i], x[i] * 0.25f);
  // Sum (the loss ledger's reduction): out += factor x sum(x), against the CPU's.
  TensorView total = gpu.Upload(zero, DType::kF32, 1);
  ASSERT_TRUE(Sum(dx, 0.5, total, gpu.stream.get()).ok());
  float t = 0;
  gpu.Download(&t, total);
  float cpu = 0;
  ASSERT_TRUE(Sum(TensorView(back.data(), DType::kF32, {n}), 0.5,
                  TensorView(&cpu, DType::kF32, {1}), nullptr)
                  .ok());
  EXPECT_NEAR(t, cpu, 1e-4 * std::abs(cpu) + 1e-3);
}

}  // namespace
}  // namespace zerort
