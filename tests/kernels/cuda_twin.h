// The CUDA kernels' twin harness: one op's inputs on the CPU (float vectors) and the GPU (copies
// in the act or grad dtype), compared norm-wise or bit for bit. Used by model_kernels_cuda_test.cc,
// kernel_fast_paths_cuda_test.cc and llama_kernels_cuda_test.cc (gpu label; skipped with the
// reason when no GPU is present).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/runtime/allocator.h"

namespace zerort::testing {

#define ZR_NEED_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason

inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1) {
  return RandomNormal<float>(n, seed, scale);
}

inline double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    r += double{want[i]} * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-30));
}

// One op's inputs on both sides: CPU float vectors, GPU copies in the act (or grad) dtype.
struct Twin {
  DType act;
  DType grad;
  Device device = Device::Cuda(0);
  std::unique_ptr<Allocator> allocator = *MakeCudaCachingAllocator(device, nullptr);
  std::unique_ptr<Stream> stream = *CreateStream(device, "compute");
  std::unique_ptr<ModelKernels> gpu = *MakeCudaModelKernels(act, grad, *stream, *allocator);
  std::unique_ptr<ModelKernels> cpu = MakeCpuModelKernels(CpuPrecision::kFloat);
  std::vector<Buffer> buffers;

  Twin(DType a, DType g) : act(a), grad(g) {}
  double tol() const { return act == DType::kF32 ? 1e-5 : 2e-2; }

  // Rounds `host` to `dtype` in place (so the CPU sees what the GPU sees) and uploads it,
  // `offset` bytes past the start of its own allocation (a sub-view of a flat buffer).
  void* Up(std::vector<float>& host, DType dtype, size_t offset = 0) {
    std::vector<std::byte> raw(host.size() * DTypeSize(dtype));
    for (size_t i = 0; i < host.size(); ++i) {
      StoreFromFloat(raw.data(), dtype, i, host[i]);
      host[i] = LoadAsFloat(raw.data(), dtype, i);
    }
    buffers.push_back(
        *allocator->Allocate(raw.size() + offset, MemoryCategory::kWorkspace, stream.get()));
    std::byte* at = static_cast<std::byte*>(buffers.back().data()) + offset;
    ZR_CHECK_OK(CopyBytes(at, device, raw.data(), Device::Cpu(), raw.size(), stream.get()));
    return at;
  }
  void* A(std::vector<float>& host) { return Up(host, act); }
  void* G(std::vector<float>& host) { return Up(host, grad); }
  int32_t* Ids(const std::vector<int32_t>& ids) {
    buffers.push_back(
        *allocator->Allocate(ids.size() * 4, MemoryCategory::kWorkspace, stream.get()));
    ZR_CHECK_OK(CopyBytes(buffers.back().data(), device, ids.data(), Device::Cpu(), ids.size() * 4,
                          stream.get()));
    return buffers.back().as<int32_t>();
  }
  std::vector<float> Down(const void* p, size_t n, DType dtype) {
    std::vector<std::byte> raw(n * DTypeSize(dtype));
    ZR_CHECK_OK(CopyBytes(raw.data(), Device::Cpu(), p, device, raw.size(), stream.get()));
    ZR_CHECK_OK(stream->Synchronize());
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = LoadAsFloat(raw.data(), dtype, i);
    return out;
  }
  void Expect(const char* what, const void* gpu_ptr, const std::vector<float>& cpu_values,
              DType dtype) {
    const std::vector<float> got = Down(gpu_ptr, cpu_values.size(), dtype);
    EXPECT_LE(RelErr(got, cpu_values), tol()) << what << " (" << DTypeName(act) << ")";
  }
};

inline const std::vector<std::pair<DType, DType>> kTypes = {{DType::kF32, DType::kF32},
                                                            {DType::kBF16, DType::kF32},
                                                            {DType::kBF16, DType::kBF16},
                                                            {DType::kF16, DType::kF32}};

// `v` rounded to `dtype` (the CPU float kernels' result as a 16-bit kernel stores it).
inline std::vector<float> RoundedTo(std::vector<float> v, DType dtype) {
  std::vector<std::byte> raw(DTypeSize(dtype));
  for (float& x : v) {
    StoreFromFloat(raw.data(), dtype, 0, x);
    x = LoadAsFloat(raw.data(), dtype, 0);
  }
  return v;
}

// The number of elements whose bits differ, and the first one.
inline void ExpectSameBits(const char* what, const std::vector<float>& got,
                           const std::vector<float>& want) {
  size_t differ = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      if (differ++ == 0) first = i;
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": first at " << first << ": " << got[first] << " against "
                        << want[first];
}

}  // namespace zerort::testing
