// [Note: the GPUs a build runs on] (runtime/cuda_arch.h): which devices a CMake architecture list
// reaches, by machine code or by PTX, and what a device it does not reach is told; and the
// device choice (ChooseDevice) on a machine without a GPU.
#include "zerort/runtime/cuda_arch.h"

#include <string>

#include "gtest/gtest.h"
#include "zerort/runtime/device.h"

namespace zerort {
namespace {

constexpr CudaCodeFit kBinary = CudaCodeFit::kBinary, kPtx = CudaCodeFit::kPtx,
                      kNone = CudaCodeFit::kNone, kUnknown = CudaCodeFit::kUnknown;

TEST(CudaArchTest, MachineCodeRunsOnItsMajorAndPtxOnLaterDevices) {
  const struct {
    const char* list;
    int major, minor;
    CudaCodeFit fit;
  } cases[] = {
      // The default: sm_80's SASS for every 8.x device, Hopper's SASS, its PTX beyond.
      {"80-real;90", 8, 0, kBinary},  // A100
      {"80-real;90", 8, 6, kBinary},  // A10, RTX 3090
      {"80-real;90", 8, 9, kBinary},  // L40S, RTX 4090
      {"80-real;90", 9, 0, kBinary},  // H100, H200
      {"80-real;90", 10, 0, kPtx},    // B200: compute_90's PTX, compiled at load
      {"80-real;90", 12, 0, kPtx},    // RTX 5090
      {"80-real;90", 7, 5, kNone},    // T4
      // Hopper's alone: nothing for an A100 (SASS does not run on an older major, PTX not on
      // an older device).
      {"90", 8, 0, kNone},
      {"90", 9, 0, kBinary},
      {"90", 10, 0, kPtx},
      {"90-real", 10, 0, kNone},  // no PTX to compile
      {"90-virtual", 9, 0, kPtx},
      {"86", 8, 0, kNone},  // SASS runs on later minors only
      {"86", 8, 9, kBinary},
      {"80-virtual", 8, 6, kPtx},
      // Arch-specific code runs on its capability only, a family's on its major.
      {"90a", 9, 0, kBinary},
      {"90a", 10, 0, kNone},
      {"100f", 10, 3, kBinary},
      {"100f-virtual", 10, 3, kPtx},
      {"100f", 12, 0, kNone},
      // Lists CMake resolves when it configures: not judged here.
      {"all", 7, 0, kUnknown},
      {"all-major", 8, 0, kUnknown},
      {"native", 9, 0, kUnknown},
      {"", 9, 0, kUnknown},
      {"9x", 9, 0, kUnknown},
      {"80;", 8, 0, kBinary},  // an empty entry after a separator is nothing
      // Malformed lists are not judged either (CMake refuses them when it configures).
      {"80;;90", 9, 0, kUnknown},
      {"123456", 9, 0, kUnknown},
      {"-real", 9, 0, kUnknown},
      {"80-real-virtual", 8, 0, kUnknown},
      {"90 ", 9, 0, kUnknown},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(CudaCodeFor(c.list, c.major, c.minor), c.fit)
        << "\"" << c.list << "\" on " << c.major << "." << c.minor;
  }
}

TEST(CudaArchTest, ADeviceTheBuildDoesNotReachIsToldWhatToRebuild) {
  const Status a100 = CheckCudaDevice("90", 8, 0, "CUDA device 0 (NVIDIA A100-SXM4-80GB)");
  EXPECT_EQ(a100.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a100.message(),
            "CUDA device 0 (NVIDIA A100-SXM4-80GB) is compute capability 8.0, and this build of "
            "zerort holds GPU code for sm_90 and PTX for compute_90 (CMAKE_CUDA_ARCHITECTURES "
            "\"90\"), none of which runs on it: rebuild with "
            "-DCMAKE_CUDA_ARCHITECTURES=\"90;80-real\"");
  const Status t4 = CheckCudaDevice("80-real;90", 7, 5, "CUDA device 1 (Tesla T4)");
  EXPECT_EQ(t4.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t4.message(),
            "CUDA device 1 (Tesla T4) is compute capability 7.5; zerort's CUDA kernels need 8.0 "
            "or later (bf16 tensor-core products, cp.async): train.device \"cpu\" runs here");
  // Even a list that would hold code for it (the kernels do not build below sm_80).
  EXPECT_FALSE(CheckCudaDevice("all", 7, 5, "d").ok());
  EXPECT_TRUE(CheckCudaDevice("80-real;90", 8, 9, "d").ok());
  EXPECT_TRUE(CheckCudaDevice("80-real;90", 10, 0, "d").ok());  // by PTX
  EXPECT_TRUE(CheckCudaDevice("native", 9, 0, "d").ok());
}

TEST(CudaArchTest, TheListInWords) {
  EXPECT_EQ(DescribeCudaArchitectures("80-real;90"), "sm_80, sm_90 and PTX for compute_90");
  EXPECT_EQ(DescribeCudaArchitectures("90"), "sm_90 and PTX for compute_90");
  EXPECT_EQ(DescribeCudaArchitectures("90a-real"), "sm_90a");
  EXPECT_EQ(DescribeCudaArchitectures("80-virtual;90-virtual"),
            "PTX for compute_80 and PTX for compute_90");
  EXPECT_EQ(DescribeCudaArchitectures("native"), "\"native\" (CMake's to resolve)");
}

// The MFU denominator by the names the driver reports (whole words: an A10G is not an A10).
TEST(CudaArchTest, ThePeakOfTheGpusByName) {
  const struct {
    const char* name;
    double peak;
  } cases[] = {{"NVIDIA H100 80GB HBM3", 989e12},
               {"NVIDIA H100 PCIe", 756e12},
               {"NVIDIA H100 NVL", 835e12},
               {"NVIDIA H200", 989e12},
               {"NVIDIA H200 NVL", 835e12},
               {"NVIDIA GH200 480GB", 989e12},
               {"NVIDIA H800 PCIe", 756e12},
               {"NVIDIA H20", 148e12},
               {"NVIDIA A100-SXM4-80GB", 312e12},
               {"NVIDIA A100 80GB PCIe", 312e12},
               {"NVIDIA A100-PCIE-40GB", 312e12},
               {"NVIDIA A10", 125e12},
               {"NVIDIA A10G", 0},
               {"NVIDIA L4", 121e12},
               {"NVIDIA L40S", 362.05e12},
               {"NVIDIA L40", 181.05e12},
               {"NVIDIA GeForce RTX 4090", 0},
               {"", 0}};
  for (const auto& c : cases) EXPECT_EQ(DenseBf16PeakFlops(c.name), c.peak) << c.name;
  // MFU's denominator: train.peak_tflops where given (any device, a known GPU's name overruled),
  // else a GPU's by its name, else none.
  EXPECT_EQ(PeakFlops(165.2, true, "NVIDIA GeForce RTX 4090"), 165.2e12);
  EXPECT_EQ(PeakFlops(900, true, "NVIDIA H100 80GB HBM3"), 900e12);
  EXPECT_EQ(PeakFlops(2.5, false, ""), 2.5e12);
  EXPECT_EQ(PeakFlops(0, true, "NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(PeakFlops(0, true, "NVIDIA GeForce RTX 4090"), 0);
  EXPECT_EQ(PeakFlops(0, false, "NVIDIA H100 80GB HBM3"), 0);
}

// ChooseDevice: "cpu" is the CPU anywhere; "" the CPU where no GPU runs this build's code;
// "cuda" there is refused saying why; anything else is named.
TEST(CudaArchTest, TheDeviceChoiceWithoutAGpu) {
  EXPECT_TRUE(ChooseDevice("cpu", 3)->is_cpu());
  const StatusOr<Device> bad = ChooseDevice("tpu", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"tpu\""), std::string_view::npos) << bad.status();
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_TRUE(ChooseDevice("", 0)->is_cpu());
  const StatusOr<Device> cuda = ChooseDevice("cuda", 1);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cuda.status().message(), "no usable GPU: " + QueryCuda().unavailable_reason);
  const Status usable = CheckCudaDeviceUsable(0);
  EXPECT_EQ(usable.code(), absl::StatusCode::kFailedPrecondition) << usable;
  // No device of that index: zeros and no name (the MFU's peak unknown, the memory check's GPU
  // bytes 0).
  const CudaDeviceInfo none = QueryCudaDevice(0);
  EXPECT_EQ(none.name, "");
  EXPECT_EQ(none.total_memory_bytes, 0u);
}

}  // namespace
}  // namespace zerort
