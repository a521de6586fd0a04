// CUDA streams and events (RAII over cudaStream_t / cudaEvent_t), copies and device queries.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "zerort/runtime/build_info.h"
#include "zerort/runtime/cuda_arch.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/internal/cublas_api.h"
#include "zerort/runtime/internal/cuda_check.h"
#include "zerort/runtime/internal/device_backend.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace internal {

Status CudaError(std::string_view call, cudaError_t err) {
  const std::string message =
      StrCat(call, " failed: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (err == cudaErrorInvalidValue || err == cudaErrorInvalidDevice) {
    return absl::InvalidArgumentError(message);
  }
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

StatusOr<bool> CudaQueryResult(std::string_view call, cudaError_t err) {
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return CudaError(call, err);
}

Status CublasError(std::string_view call, cublasStatus_t err) {
  // A cuBLAS call failed, so the library is loaded and this returns its table at once.
  StatusOr<const CublasApi*> api = LoadCublas();
  if (!api.ok()) return absl::InternalError(StrCat(call, " failed: cuBLAS status ", err));
  return absl::InternalError(StrCat(call, " failed: ", (*api)->GetStatusString(err), " (",
                                    (*api)->GetStatusName(err), ")"));
}

namespace {

// Restores the calling thread's current device when it goes out of scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cudaGetDevice(&previous_);
    if (previous_ != index) cudaSetDevice(index);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

class CudaStream final : public Stream {
 public:
  CudaStream(Device device, cudaStream_t stream, std::string name)
      : device_(device), stream_(stream), name_(std::move(name)) {}
  ~CudaStream() override {
    DeviceGuard guard(device_.index);
    cudaStreamDestroy(stream_);
  }
  Device device() const override { return device_; }
  std::string_view name() const override { return name_; }
  Status Synchronize() override {
    ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  Status WaitEvent(const Event& event) override {
    if (!event.device().is_cuda()) return absl::OkStatus();  // a CPU event is always complete
    ZR_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event.native_handle()), 0));
    return absl::OkStatus();
  }
  void* native_handle() const override { return stream_; }

 private:
  Device device_;
  cudaStream_t stream_;
  std::string name_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(Device device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  Device device() const override { return device_; }
  Status Record(Stream& stream) override {
    if (!stream.device().is_cuda()) {
      return absl::InvalidArgumentError(
          StrCat("CUDA event recorded on a stream of ", stream.device().ToString()));
    }
    ZR_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native_handle())));
    return absl::OkStatus();
  }
  StatusOr<bool> Query() const override {
    return CudaQueryResult("cudaEventQuery", cudaEventQuery(event_));
  }
  Status Synchronize() const override {
    ZR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return absl::OkStatus();
  }
  void* native_handle() const override { return event_; }

 private:
  Device device_;
  cudaEvent_t event_;
};

// A timing cudaEvent ([Note: stream marks]).
class CudaStreamMark final : public StreamMark {
 public:
  CudaStreamMark(Device device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaStreamMark() override { cudaEventDestroy(event_); }
  Device device() const override { return device_; }
  Status Record(Stream& stream) override {
    if (stream.device() != device_) {
      return absl::InvalidArgumentError(StrCat("a stream mark of ", device_.ToString(),
                                               " recorded on a stream of ",
                                               stream.device().ToString()));
    }
    ZR_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native_handle())));
    recorded_ = true;
    return absl::OkStatus();
  }
  StatusOr<double> SecondsSince(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const CudaStreamMark*>(&earlier);
    if (e == nullptr || e->device_ != device_) {
      return absl::InvalidArgumentError(
          StrCat("stream marks of ", device_.ToString(), " and ", earlier.device().ToString()));
    }
    if (!recorded_ || !e->recorded_) {
      return absl::FailedPreconditionError("a stream mark read before it was recorded");
    }
    ZR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    ZR_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e->event_));
    float ms = 0;
    ZR_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, e->event_, event_));
    return ms * 1e-3;
  }

 private:
  Device device_;
  cudaEvent_t event_;
  bool recorded_ = false;
};

Status CheckUsable(Device device) {
  const int count = CudaDeviceCount();
  if (device.index < 0 || device.index >= count) {
    const CudaInfo info = QueryCuda();
    return absl::FailedPreconditionError(
        StrCat("CUDA device ", device.index, " is not available (", count, " visible",
               info.unavailable_reason.empty() ? "" : "; ", info.unavailable_reason, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Stream>> CreateCudaStream(Device device, std::string name) {
  // Streams are made when a run or a test sets up, before any kernel: a device this build's code
  // does not run on is named here, not by the first launch's "no kernel image".
  ZR_RETURN_IF_ERROR(CheckCudaDeviceUsable(device.index));
  DeviceGuard guard(device.index);
  cudaStream_t stream = nullptr;
  ZR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Stream>(new CudaStream(device, stream, std::move(name)));
}

// [Note: host waits sleep]
// A thread that waits for an event (Event::Synchronize: the host step's write-backs, a gradient
// slice's copy to the host) used to spin on a core until the GPU got there: CUDA's default for a
// process with fewer contexts than cores. With the optimizer offloaded that core belongs to the
// host AdamW's OpenMP team, whose static split then waits for the one thread that shares its core
// with the spinner (the thirteenth run's host update was about 4x slower beside the forward than
// alone; docs/gpu.md). So every event is made with cudaEventBlockingSync: the waiting thread
// sleeps and is woken when the event completes (tens of microseconds later, off the GPU's path:
// the GPU has queued work while the host waits for it). Stream-to-stream waits
// (cudaStreamWaitEvent) do not involve the host and are unchanged; Stream::Synchronize
// (cudaStreamSynchronize) still spins. Not yet measured on a GPU.
StatusOr<std::unique_ptr<Event>> CreateCudaEvent(Device device) {
  ZR_RETURN_IF_ERROR(CheckUsable(device));
  DeviceGuard guard(device.index);
  cudaEvent_t event = nullptr;
  ZR_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  return std::unique_ptr<Event>(new CudaEvent(device, event));
}

StatusOr<std::unique_ptr<StreamMark>> CreateCudaStreamMark(Device device) {
  ZR_RETURN_IF_ERROR(CheckUsable(device));
  DeviceGuard guard(device.index);
  cudaEvent_t event = nullptr;
  ZR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDefault));
  return std::unique_ptr<StreamMark>(new CudaStreamMark(device, event));
}

Status CudaCopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                     Stream* stream) {
  if (stream != nullptr && stream->device().is_cuda()) {
    ZR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                            static_cast<cudaStream_t>(stream->native_handle())));
    return absl::OkStatus();
  }
  // Without a stream: done when this returns. cudaMemcpy alone may return before a copy from
  // pageable host memory reaches the device (it only waits for the staging copy), and the streams
  // zerort creates are non-blocking, so nothing would order their later reads after that DMA.
  ZR_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

Status CudaCopyFromHostNow(void* dst, Device dst_device, const void* src, size_t bytes,
                           Stream* stream) {
  if (stream == nullptr || stream->device() != dst_device) {
    return CudaCopyBytes(dst, dst_device, src, Device::Cpu(), bytes, nullptr);  // done on return
  }
  const auto* s = static_cast<const std::byte*>(src);
  auto* snapshot = new std::vector<std::byte>(s, s + bytes);
  auto handle = static_cast<cudaStream_t>(stream->native_handle());
  const cudaError_t copied =
      cudaMemcpyAsync(dst, snapshot->data(), bytes, cudaMemcpyHostToDevice, handle);
  if (copied != cudaSuccess) {
    delete snapshot;
    ZR_CUDA_RETURN_IF_ERROR(copied);
  }
  // Freed on the host once the stream has run the copy (a host function may not call CUDA).
  ZR_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(
      handle, [](void* p) { delete static_cast<std::vector<std::byte>*>(p); }, snapshot));
  return absl::OkStatus();
}

Status CudaFillBytes(void* ptr, Device device, size_t bytes, uint8_t value, Stream* stream) {
  if (stream != nullptr && stream->device() == device) {
    ZR_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(ptr, value, bytes, static_cast<cudaStream_t>(stream->native_handle())));
    return absl::OkStatus();
  }
  // cudaMemset on device memory returns before it runs: wait, for the same reason as above.
  ZR_CUDA_RETURN_IF_ERROR(cudaMemset(ptr, value, bytes));
  ZR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

}  // namespace internal

CudaInfo QueryCuda() {
  CudaInfo info;
  info.compiled = true;
  cudaRuntimeGetVersion(&info.runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.unavailable_reason = StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return info;
  }
  if (count == 0) info.unavailable_reason = "no CUDA device is visible";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    const Status runs = CheckCudaDevice(GetBuildInfo().cuda_architectures, prop.major, prop.minor,
                                        StrCat("CUDA device ", i, " (", prop.name, ")"));
    info.devices.push_back(
        CudaDeviceInfo{.index = i,
                       .name = prop.name,
                       .compute_capability_major = prop.major,
                       .compute_capability_minor = prop.minor,
                       .total_memory_bytes = prop.totalGlobalMem,
                       .multiprocessor_count = prop.multiProcessorCount,
                       .shared_memory_per_block = static_cast<int64_t>(prop.sharedMemPerBlockOptin),
                       .unusable_reason = runs.ok() ? "" : std::string(runs.message())});
  }
  return info;
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Status CheckCudaDeviceUsable(int index) {
  ZR_RETURN_IF_ERROR(internal::CheckUsable(Device::Cuda(index)));
  int major = 0, minor = 0;  // two attribute reads; the name only for the message
  ZR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  ZR_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  const std::string& built = GetBuildInfo().cuda_architectures;
  if (CheckCudaDevice(built, major, minor, "").ok()) return absl::OkStatus();
  cudaDeviceProp prop{};
  const bool named = cudaGetDeviceProperties(&prop, index) == cudaSuccess;
  return CheckCudaDevice(built, major, minor,
                         StrCat("CUDA device ", index, named ? StrCat(" (", prop.name, ")") : ""));
}

Status SetCurrentDevice(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
  ZR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  return absl::OkStatus();
}

}  // namespace zerort
