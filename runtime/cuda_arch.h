// Which GPUs a build's CUDA code runs on: CMake's CUDA_ARCHITECTURES (runtime/build_info.h's
// cuda_architectures) against a device's compute capability. No CUDA here: the rules are
// tested on machines without a GPU, and every CUDA device a run opens is checked by them.
//
// [Note: the GPUs a build runs on]
// - A build holds, for each entry of CMAKE_CUDA_ARCHITECTURES, machine code (SASS, `sm_XY`:
//   "XY-real", or "XY") and/or PTX (`compute_XY`: "XY-virtual", or "XY"). SASS for sm_XY runs on
//   devices of the same major version and a minor at least Y (sm_80's on an A100, an RTX 3090 at
//   8.6 and an L40S at 8.9); PTX for compute_XY runs on any device of capability at least X.Y,
//   compiled by the driver when the process first loads it (a slower first start: a Blackwell
//   GPU runs the default build's compute_90 PTX). The "a" entries (sm_90a) run on exactly X.Y,
//   the "f" ones (CUDA 12.9's families) on X.Y and later minors of X.
// - zerort's kernels need compute capability 8.0 (bf16 tensor-core products, cp.async), so an
//   older device is refused whatever the build holds.
// - The default (CMakeLists.txt) is "80-real;90": sm_80's SASS (A100, A10, RTX 30 and 40, L4,
//   L40S), sm_90's SASS and PTX (H100, H200; Blackwell through the PTX). A device none of the
//   build's code runs on would otherwise fail at its first kernel launch with "no kernel image is
//   available", deep inside a run; CheckCudaDevice says at the start which device, which
//   capability, what the build holds and the CMake option that fixes it.
// - "all", "all-major" and "native" (CMake picks the list when it configures) cannot be judged
//   from the string; they pass, and the driver's own error stays the last word.
#pragma once

#include <string>
#include <string_view>

#include "zerort/runtime/status.h"

namespace zerort {

// The lowest compute capability zerort's CUDA kernels run on (major x 10 + minor).
inline constexpr int kMinCudaComputeCapability = 80;

// How a build's code reaches a device ([Note: the GPUs a build runs on]).
enum class CudaCodeFit {
  kBinary,   // machine code for it
  kPtx,      // only PTX, compiled by the driver at load
  kNone,     // nothing that runs on it
  kUnknown,  // the list is CMake's to resolve ("all", "native", ...): assumed to run
};

CudaCodeFit CudaCodeFor(std::string_view architectures, int major, int minor);

// OK when this build's code (`architectures`, CMake's list) runs on a device of compute
// capability major.minor, else FailedPrecondition naming `device` (e.g. "CUDA device 0 (NVIDIA
// A100-SXM4-80GB)"), its capability, what the build holds and how to rebuild.
Status CheckCudaDevice(std::string_view architectures, int major, int minor,
                       std::string_view device);

// "sm_80, sm_90 and PTX for compute_90": what `architectures` holds, in words.
std::string DescribeCudaArchitectures(std::string_view architectures);

}  // namespace zerort
