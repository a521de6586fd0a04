// kernels/onebit.h on CUDA against the CPU twin, bit for bit (gpu label): 1-bit Adam's three
// phases and 0/1 Adam's local step and synchronisation on fp32 state with a bf16 compute copy,
// 1-bit LAMB's fused momentum and reconstruction (its sums within rounding), the
// scaled-sign compression (given the same sum of squares: the sums themselves are reduced in each
// device's order) with chunks placed apart, and decoding over several sources; skipped with the
// reason when no GPU is present.
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/kernels/onebit.h"
#include "zerort/runtime/allocator.h"

namespace zerort {
namespace {

class OnGpu {
 public:
  OnGpu()
      : gpu_(Device::Cuda(0)),
        allocator_(*MakeCudaCachingAllocator(gpu_, nullptr)),
        stream_(*CreateStream(gpu_, "compute")) {}
  Stream* stream() { return stream_.get(); }
  Device device() const { return gpu_; }
  // A device copy of `host` (kept until the end of the test).
  void* Up(const void* host, size_t bytes) {
    buffers_.push_back(*allocator_->Allocate(bytes, MemoryCategory::kWorkspace, stream_.get()));
    EXPECT_TRUE(CopyBytes(buffers_.back().data(), gpu_, host, Device::Cpu(), bytes, stream()).ok());
    return buffers_.back().data();
  }
  // The same for fp32 values, as a view of the device copy.
  TensorView UpF32(const std::vector<float>& host) {
    const int64_t n = static_cast<int64_t>(host.size());
    return TensorView(Up(host.data(), host.size() * 4), DType::kF32, {n}, gpu_);
  }
  std::vector<float> Down(const TensorView& v) {
    return Down<float>(v.data(), static_cast<size_t>(v.numel()));
  }
  template <typename T>
  std::vector<T> Down(const void* device, size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(CopyBytes(out.data(), Device::Cpu(), device, gpu_, n * sizeof(T), stream()).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
    return out;
  }

 private:
  Device gpu_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Stream> stream_;
  std::vector<Buffer> buffers_;
};

std::vector<float> Normal(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// A variance-like vector: squares of normal values.
std::vector<float> NormalSquared(size_t n, uint32_t seed, float scale) {
  std::vector<float> v = Normal(n, seed, scale);
  for (float& x : v) x = x * x;
  return v;
}

TensorView Host(std::vector<float>& x) {
  return TensorView(x.data(), DType::kF32, {static_cast<int64_t>(x.size())});
}

TEST(OneBitCudaTest, AdamPhasesMatchTheCpuBitwise) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  OnGpu gpu;
  const int64_t n = (1 << 18) + 5;
  std::vector<float> p = Normal(n, 1, 1.0f), g = Normal(n, 2, 0.1f), m = Normal(n, 3, 0.01f);
  std::vector<float> v = NormalSquared(n, 4, 0.001f);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  const TensorView dp = gpu.UpF32(p), dg = gpu.UpF32(g), dm = gpu.UpF32(m), dv = gpu.UpF32(v);
  const TensorView dout(gpu.Up(out.data(), out.size() * 2), DType::kBF16, {n}, gpu.device());
  const OneBitAdamHyper h{.lr = 1e-3f, .weight_decay = 0.01f, .grad_scale = 0.5f};
  for (OneBitPhase phase : {OneBitPhase::kWarmup, OneBitPhase::kMomentum, OneBitPhase::kApply}) {
    ASSERT_TRUE(OneBitAdamStep(h, phase, Host(p), Host(g), Host(m), Host(v),
                               TensorView(out.data(), DType::kBF16, {n}), nullptr)
                    .ok());
    ASSERT_TRUE(OneBitAdamStep(h, phase, dp, dg, dm, dv, dout, gpu.stream()).ok());
    const int which = static_cast<int>(phase);
    EXPECT_EQ(gpu.Down(dp), p) << which;
    EXPECT_EQ(gpu.Down(dm), m) << which;
    EXPECT_EQ(gpu.Down(dv), v) << which;
    EXPECT_EQ(gpu.Down<uint16_t>(dout.data(), out.size()), out) << which;
  }
}

TEST(OneBitCudaTest, ZeroOnePhasesMatchTheCpuBitwise) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  OnGpu gpu;
  const int64_t n = (1 << 17) + 3;
  std::vector<float> p = Normal(n, 7, 1.0f), m = Normal(n, 8, 0.01f);
  std::vector<float> v = NormalSquared(n, 9, 0.001f), acc = Normal(n, 10, 1e-4f);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  const TensorView dp = gpu.UpF32(p), dm = gpu.UpF32(m), dv = gpu.UpF32(v), dacc = gpu.UpF32(acc);
  const TensorView dout(gpu.Up(out.data(), out.size() * 2), DType::kBF16, {n}, gpu.device());
  const OneBitAdamHyper h{.lr = 1e-3f, .weight_decay = 0.01f};
  for (ZeroOnePhase phase :
       {ZeroOnePhase::kLocalStep, ZeroOnePhase::kSyncOut, ZeroOnePhase::kSyncIn}) {
    ASSERT_TRUE(ZeroOneAdamStep(h, 3e-3f, phase, Host(p), Host(m), Host(v), Host(acc),
                                TensorView(out.data(), DType::kBF16, {n}), nullptr)
                    .ok());
    ASSERT_TRUE(ZeroOneAdamStep(h, 3e-3f, phase, dp, dm, dv, dacc, dout, gpu.stream()).ok());
    const int which = static_cast<int>(phase);
    EXPECT_EQ(gpu.Down(dp), p) << which;
    EXPECT_EQ(gpu.Down(dm), m) << which;
    EXPECT_EQ(gpu.Down(dacc), acc) << which;
    EXPECT_EQ(gpu.Down<uint16_t>(dout.data(), out.size()), out) << which;
  }
}

TEST(OneBitCudaTest, LambMomentumAndReconstructionMatchTheCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  OnGpu gpu;
  const int64_t n = (1 << 18) + 7;
  std::vector<float> p = Normal(n, 11, 1.0f), g = Normal(n, 12, 0.1f), m = Normal(n, 13, 0.01f);
  std::vector<float> v = NormalSquared(n, 14, 0.001f), fresh = NormalSquared(n, 15, 0.001f);
  std::vector<float> fused(n), u(n), stats = {0.0f, 0.0f, 0.0f};
  const TensorView dp = gpu.UpF32(p), dg = gpu.UpF32(g), dm = gpu.UpF32(m), dv = gpu.UpF32(v),
                   df = gpu.UpF32(fresh), dfused = gpu.UpF32(fused), du = gpu.UpF32(u),
                   dstats = gpu.UpF32(stats);
  const OneBitAdamHyper h{.weight_decay = 0.01f, .grad_scale = 0.5f};
  ASSERT_TRUE(OneBitLambMomentum(h, 1.7f, Host(g), Host(m), Host(fused), nullptr).ok());
  ASSERT_TRUE(OneBitLambMomentum(h, 1.7f, dg, dm, dfused, gpu.stream()).ok());
  EXPECT_EQ(gpu.Down(dfused), fused);
  ASSERT_TRUE(OneBitLambReconstruct(h, 1.7f, Host(p), Host(fused), Host(m), Host(v), Host(fresh),
                                    Host(u), Host(stats), nullptr)
                  .ok());
  ASSERT_TRUE(
      OneBitLambReconstruct(h, 1.7f, dp, dfused, dm, dv, df, du, dstats, gpu.stream()).ok());
  // The element math bitwise; the sums in each device's order (the GPU's in fp32 per block, then
  // atomically: within 1e-4), the largest ratio exactly.
  EXPECT_EQ(gpu.Down(dm), m);
  EXPECT_EQ(gpu.Down(df), fresh);
  EXPECT_EQ(gpu.Down(du), u);
  const std::vector<float> got = gpu.Down(dstats);
  EXPECT_NEAR(got[0], stats[0], 1e-4 * stats[0]);
  EXPECT_NEAR(got[1], stats[1], 1e-4 * stats[1]);
  EXPECT_EQ(got[2], stats[2]);
}

TEST(OneBitCudaTest, CompressionAndDecodingMatchTheCpuBitwise) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  OnGpu gpu;
  const int64_t chunk = 4096, chunks = 3, n = chunk * chunks, stride = chunk / 8 + 37;
  std::vector<float> b = Normal(n, 5, 1.0f);
  b[7] = 0.0f;
  b[8] = -0.0f;
  float sum_sq = 0;
  for (float x : b) sum_sq += x * x;
  std::vector<uint8_t> bits(static_cast<size_t>(stride * chunks), 0x5A);
  float scale = 0;
  float* db = static_cast<float*>(gpu.Up(b.data(), n * 4));
  float* dsum = static_cast<float*>(gpu.Up(&sum_sq, 4));
  float* dscale = static_cast<float*>(gpu.Up(&scale, 4));
  uint8_t* dbits = static_cast<uint8_t*>(gpu.Up(bits.data(), bits.size()));
  ASSERT_TRUE(SignCompress(TensorView(b.data(), DType::kF32, {n}), &sum_sq, &scale, bits.data(),
                           chunk, stride, nullptr)
                  .ok());
  ASSERT_TRUE(SignCompress(TensorView(db, DType::kF32, {n}, gpu.device()), dsum, dscale, dbits,
                           chunk, stride, gpu.stream())
                  .ok());
  EXPECT_EQ(gpu.Down<float>(dscale, 1)[0], scale);
  EXPECT_EQ(gpu.Down<float>(db, n), b);
  EXPECT_EQ(gpu.Down<uint8_t>(dbits, bits.size()), bits);
  // The three chunks as three sources, with scales 2 floats apart, added into a vector.
  const float scales[] = {0.5f, 0.0f, 1.25f, 0.0f, 3.0f};
  float* dscales = static_cast<float*>(gpu.Up(scales, sizeof(scales)));
  std::vector<float> acc = Normal(chunk - 3, 6, 1.0f);
  float* dacc = static_cast<float*>(gpu.Up(acc.data(), acc.size() * 4));
  const int64_t m = static_cast<int64_t>(acc.size());
  ASSERT_TRUE(SignDecode(bits.data(), stride, scales, 2, 3, 1.0f / 3, true,
                         TensorView(acc.data(), DType::kF32, {m}), nullptr)
                  .ok());
  ASSERT_TRUE(SignDecode(dbits, stride, dscales, 2, 3, 1.0f / 3, true,
                         TensorView(dacc, DType::kF32, {m}, gpu.device()), gpu.stream())
                  .ok());
  EXPECT_EQ(gpu.Down<float>(dacc, acc.size()), acc);
}

}  // namespace
}  // namespace zerort
