// Devices, streams and events. A Stream is an ordered queue of work on one device; an Event marks
// a point in a stream that other streams (or the host) can wait for. On CUDA they wrap
// cudaStream_t / cudaEvent_t (RAII); on the CPU work runs when it is issued, so a CPU stream is
// always idle and a CPU event is complete as soon as it is recorded. No CUDA header is included
// here: CUDA handles are exposed as void* through native_handle().
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zerort {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

class Event;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;
  // Blocks the host until all work issued so far on this stream has finished.
  virtual Status Synchronize() = 0;
  // Work issued on this stream after this call waits for `event` (never blocks the host).
  virtual Status WaitEvent(const Event& event) = 0;
  // cudaStream_t for CUDA streams, nullptr for CPU streams.
  virtual void* native_handle() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual Device device() const = 0;
  // Marks the current end of `stream`'s work.
  virtual Status Record(Stream& stream) = 0;
  // True once the work before the last Record has finished (true if never recorded).
  virtual StatusOr<bool> Query() const = 0;
  virtual Status Synchronize() const = 0;
  virtual void* native_handle() const = 0;
};

// A stream on `device`. `name` says what the stream exists for (compute, comm, copy).
StatusOr<std::unique_ptr<Stream>> CreateStream(Device device, std::string name);
StatusOr<std::unique_ptr<Event>> CreateEvent(Device device);

// Copies `bytes` between any two of host and CUDA memory. With a CUDA stream the copy is
// asynchronous on it (host memory must then stay alive until the stream reaches the copy);
// without one, or when both sides are host memory, it has finished when this returns.
Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream* stream);

// Sets `bytes` bytes at `ptr` to zero: asynchronously on a CUDA stream for device memory,
// immediately for host memory.
Status FillZero(void* ptr, Device device, size_t bytes, Stream* stream);

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
};

struct CudaInfo {
  bool compiled = false;           // built with CUDA
  int runtime_version = 0;         // e.g. 13000
  int driver_version = 0;          // 0 when no driver is loaded
  std::string unavailable_reason;  // why no device can be used, empty when one can
  std::vector<CudaDeviceInfo> devices;
};

// What CUDA can offer this process; never fails: a missing driver or device is a reason.
CudaInfo QueryCuda();

// Dense bf16 peak FLOP/s (no sparsity) of a GPU by its name (CudaDeviceInfo::name), the MFU
// denominator; 0 when the name is not known.
double DenseBf16PeakFlops(std::string_view device_name);

// Number of usable CUDA devices (0 without CUDA, driver or device).
int CudaDeviceCount();

// Makes `device` current for this host thread (no-op for the CPU).
Status SetCurrentDevice(Device device);

}  // namespace zerort
