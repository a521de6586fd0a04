// CachingAllocator backends over cudaMalloc (device tier) and cudaHostAlloc (pinned host tier).
#include <cuda_runtime_api.h>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/internal/cuda_check.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

class CudaDeviceBackend final : public CachingBackend {
 public:
  explicit CudaDeviceBackend(Device device) : device_(device) {}
  Device device() const override { return device_; }
  std::string_view name() const override { return "cudaMalloc"; }
  StatusOr<void*> Map(size_t bytes) override {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it for the retry
      return internal::CudaError(StrCat("cudaMalloc(", bytes, ")"), err);
    }
    return ptr;
  }
  void Unmap(void* ptr, size_t) override { cudaFree(ptr); }
  Status SynchronizeDevice() override {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    ZR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }
  StatusOr<std::unique_ptr<Event>> NewEvent() override { return CreateEvent(device_); }

 private:
  Device device_;
};

class PinnedHostBackend final : public CachingBackend {
 public:
  explicit PinnedHostBackend(Device event_device) : event_device_(event_device) {}
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return "cudaHostAlloc"; }
  StatusOr<void*> Map(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return internal::CudaError(StrCat("cudaHostAlloc(", bytes, ")"), err);
    }
    return ptr;
  }
  void Unmap(void* ptr, size_t) override { cudaFreeHost(ptr); }
  Status SynchronizeDevice() override {
    ZR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }
  StatusOr<std::unique_ptr<Event>> NewEvent() override { return CreateEvent(event_device_); }

 private:
  Device event_device_;
};

constexpr uint64_t kStreamOrderedPoolKeep = uint64_t{2} << 20;

Status NeedDevice(std::string_view what) {
  if (CudaDeviceCount() > 0) return absl::OkStatus();
  const CudaInfo info = QueryCuda();
  return absl::FailedPreconditionError(
      StrCat(what, " needs a CUDA device: ", info.unavailable_reason));
}

}  // namespace

StatusOr<std::unique_ptr<Allocator>> MakeCudaCachingAllocator(Device device,
                                                              MemoryTracker* tracker) {
  ZR_RETURN_IF_ERROR(NeedDevice("the CUDA caching allocator"));
  if (!device.is_cuda() || device.index >= CudaDeviceCount()) {
    return absl::InvalidArgumentError(StrCat("no CUDA device ", device.ToString()));
  }
  // The reductions' partials (kernels/cuda/reduce.cu, 2 KiB each) come from the device's default
  // stream-ordered pool: with its release threshold at 0 the pool hands what was freed back to
  // the driver at every synchronisation, and the next step's reductions map it again. Keep up to
  // kStreamOrderedPoolKeep in it (not in the tracker: at most a few partials are live at once).
  cudaMemPool_t pool = nullptr;
  ZR_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device.index));
  uint64_t keep = kStreamOrderedPoolKeep;
  ZR_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  CachingAllocatorOptions options;
  options.tier = MemoryTier::kDevice;
  options.tracker = tracker;
  return std::unique_ptr<Allocator>(
      new CachingAllocator(std::make_unique<CudaDeviceBackend>(device), options));
}

StatusOr<std::unique_ptr<Allocator>> MakePinnedHostAllocator(MemoryTracker* tracker) {
  ZR_RETURN_IF_ERROR(NeedDevice("pinned host memory"));
  int current = 0;
  ZR_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  CachingAllocatorOptions options;
  options.tier = MemoryTier::kPinnedHost;
  options.tracker = tracker;
  return std::unique_ptr<Allocator>(
      new CachingAllocator(std::make_unique<PinnedHostBackend>(Device::Cuda(current)), options));
}

}  // namespace zerort
