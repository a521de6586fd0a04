// The CUDA entry points of a build without CUDA: each answers with a clear error.
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/internal/device_backend.h"

namespace zerort {
namespace internal {
namespace {

Status NoCuda(std::string_view what) {
  return absl::FailedPreconditionError(
      std::string(what) + ": zerort was built without CUDA (reconfigure with -DZR_ENABLE_CUDA=ON)");
}

}  // namespace

StatusOr<std::unique_ptr<Stream>> CreateCudaStream(Device, std::string) {
  return NoCuda("CreateStream(cuda)");
}
StatusOr<std::unique_ptr<Event>> CreateCudaEvent(Device) { return NoCuda("CreateEvent(cuda)"); }
StatusOr<std::unique_ptr<StreamMark>> CreateCudaStreamMark(Device) {
  return NoCuda("CreateStreamMark(cuda)");
}
Status CudaCopyBytes(void*, Device, const void*, Device, size_t, Stream*) {
  return NoCuda("CopyBytes to or from CUDA memory");
}
Status CudaCopyFromHostNow(void*, Device, const void*, size_t, Stream*) {
  return NoCuda("CopyFromHostNow to CUDA memory");
}
Status CudaFillBytes(void*, Device, size_t, uint8_t, Stream*) {
  return NoCuda("FillBytes of CUDA memory");
}

}  // namespace internal

CudaInfo QueryCuda() {
  CudaInfo info;
  info.unavailable_reason = "built without CUDA";
  return info;
}

int CudaDeviceCount() { return 0; }

Status CheckCudaDeviceUsable(int index) {
  return internal::NoCuda("CUDA device " + std::to_string(index));
}

Status SetCurrentDevice(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
  return internal::NoCuda("SetCurrentDevice");
}

}  // namespace zerort

// Allocators that need CUDA.

namespace zerort {

StatusOr<std::unique_ptr<Allocator>> MakeCudaCachingAllocator(Device, MemoryTracker*) {
  return internal::NoCuda("the CUDA caching allocator");
}

StatusOr<std::unique_ptr<Allocator>> MakePinnedHostAllocator(MemoryTracker*) {
  return internal::NoCuda("pinned host memory");
}

}  // namespace zerort
