// CUDA twins of the optimizer and reduction kernels against the CPU ones, on fresh random
// inputs (gpu label; skipped with the reason when no GPU is present). Tolerances: fp32 state
// within 1e-6 relative (the CUDA kernel may fuse a multiply-add the CPU does in two roundings);
// the compute copy within one unit of its last place.
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "kernels/reduce.h"
#include "runtime/allocator.h"

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

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

TEST(OptimizerCudaTest, AdamMatchesCpu) {
  ZR_NEED_GPU();
  Gpu gpu;
  const int64_t n = (1 << 20) + 7;
  for (const auto [decoupled, bias_correction] :
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
    std::vector<float> gp(n);
    std::vector<uint16_t> gout(n);
    gpu.Download(gp.data(), dp);
    gpu.Download(gout.data(), dout);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(gp[i], p[i], 1e-6f * (std::abs(p[i]) + 1e-3f)) << i;
      ASSERT_LE(std::abs(static_cast<int>(gout[i]) - static_cast<int>(out[i])), 1) << i;
    }
  }
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
  std::vector<float> gp(n);
  gpu.Download(gp.data(), dp);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(gp[i], p[i], 1e-6f * (std::abs(p[i]) + 1e-3f)) << i;
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
}

}  // namespace
}  // namespace zerort
