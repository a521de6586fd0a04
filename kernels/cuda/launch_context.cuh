// What a CUDA program issuing kernels for the model kernels needs from them (internal to
// kernels/cuda/, included by model_kernels.cu and the programs it runs): their stream, scratch
// from their workspace allocator in the stream's order, and their launch census
// (ModelKernels::launches()) with each launch's error check.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <unordered_map>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/internal/cuda_check.h"
#include "zerort/runtime/status.h"

namespace zerort {
namespace {

struct LaunchContext {
  Stream& stream;
  Allocator& workspace;
  // By the name's literal, so that counting a launch hashes a pointer, no string.
  std::unordered_map<const char*, int64_t>& launches;

  cudaStream_t s() const { return static_cast<cudaStream_t>(stream.native_handle()); }
  StatusOr<Buffer> Scratch(int64_t bytes) const {
    return workspace.Allocate(static_cast<size_t>(bytes), MemoryCategory::kWorkspace, &stream);
  }
  // After each kernel launch: counts it and reports a launch error naming it.
  Status Launched(const char* what) const {
    ++launches[what];
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
      return internal::CudaError(what, err);
    }
    return absl::OkStatus();
  }
};

}  // namespace
}  // namespace zerort
