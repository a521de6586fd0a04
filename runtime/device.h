// Devices, streams and events. A Stream is an ordered queue of work on one device; an Event marks
// a point in a stream that other streams (or the host) can wait for. On CUDA they wrap
// cudaStream_t / cudaEvent_t (RAII). A CPU stream is immediate (work runs when it is issued, so
// the stream is always idle and an event recorded on it complete) or queued (the cpu-async
// device below). No CUDA header is included here: CUDA handles are exposed as void* through
// native_handle().
//
// [Note: the asynchronous CPU device] A queued CPU stream is an in-order queue run by a thread of
// its own: work issued on it (Launch, CopyBytes, FillZero) runs there in issue order while the
// host goes on, as on CUDA. Event::Record queues a marker that completes the event when the
// stream reaches it; Stream::WaitEvent queues a wait for the record current at the call (CUDA's
// rule; an event never recorded is complete); Synchronize waits for everything issued. An
// immediate stream told to wait for an event waits on the host at once, since its next work runs
// there. The first failed work item's error sticks to the stream (later work is skipped, every
// Launch and Synchronize returns it), but markers still run, so nothing waits forever on a failed
// stream. Work must not synchronize its own stream (checked). docs/async-device.md says how the
// rest of zerort runs on it.
//
// [Note: jitter] A seeded jitter (StreamOptions::jitter_seed) delays each item of a queued stream
// by a random 0..jitter_max_us, so that a missing event shows up as a wrong number or a sanitizer
// report instead of hiding behind timing. Each stream draws from its own generator (the seed
// mixed with its name), which only the stream's thread touches.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"

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

// How a CPU stream runs its work (ignored by CUDA streams).
enum class CpuExecution : uint8_t {
  kImmediate,  // on the issuing thread, when issued
  kQueued,     // on the stream's own thread, in issue order ([Note: the asynchronous CPU device])
};

struct StreamOptions {
  CpuExecution cpu = CpuExecution::kImmediate;
  uint64_t jitter_seed = 0;  // queued streams: 0 no jitter; else each item waits 0..jitter_max_us
  int jitter_max_us = 100;
};

// One wait of a stream's work for an event recorded on another stream (Stream::TakeWaits).
struct StreamWait {
  std::string recorder;  // the name of the stream the event was recorded on
  std::chrono::system_clock::time_point begin, end;
};
inline constexpr size_t kStreamWaitsKept = size_t{1} << 16;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;
  // Blocks the host until all work issued so far on this stream has finished.
  virtual Status Synchronize() = 0;
  // Work issued on this stream after this call waits for `event` (never blocks the host, except
  // on an immediate CPU stream, whose next work runs on the host).
  virtual Status WaitEvent(const Event& event) = 0;
  // Runs host code in this stream's order: now on an immediate CPU stream, on the stream's
  // thread for a queued one (its error then surfaces at a later Launch or Synchronize). CUDA
  // streams refuse it (their work is kernels).
  virtual Status Launch(std::function<Status()> work);
  // Whether work may still be running when the call that issued it returns (CUDA, queued CPU).
  virtual bool asynchronous() const { return !device().is_cpu(); }
  // cudaStream_t for CUDA streams, nullptr for CPU streams.
  virtual void* native_handle() const = 0;
  // The waits of this stream's work for events recorded on other streams since the last call,
  // oldest first (at most kStreamWaitsKept; older ones are dropped): a queued CPU stream measures
  // each WaitEvent on its thread. The trainer's exposed communication is the compute stream's
  // waits on "comm" while collectives ran there (engine/comm_spans.h). Empty where not measured
  // (immediate CPU streams, whose waits are on the host, and CUDA streams).
  virtual std::vector<StreamWait> TakeWaits() { return {}; }
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

// [Note: stream marks] A StreamMark is a clock reading taken when a stream reaches a point of its
// work, for timing the work between two points (`zerort bench model --timeline`): on CUDA a
// timing cudaEvent (an Event is created without timing, which keeps it cheap), on a CPU stream
// the host's steady clock read in the stream's order (at once on an immediate stream, on a
// queued stream's thread when it gets there). A mark is read once the stream has passed it:
// SecondsSince waits for this mark on CUDA and refuses a CPU mark its stream has not reached
// (synchronize the stream first). Re-recording a mark moves it.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  virtual Device device() const = 0;
  virtual Status Record(Stream& stream) = 0;
  // Seconds from `earlier` (a mark of the same device) to this mark; negative if this mark came
  // first. Both must have been recorded.
  virtual StatusOr<double> SecondsSince(const StreamMark& earlier) const = 0;
};

// A stream on `device`. `name` says what the stream exists for (compute, comm, copy).
StatusOr<std::unique_ptr<Stream>> CreateStream(Device device, std::string name,
                                               const StreamOptions& options = {});
StatusOr<std::unique_ptr<Event>> CreateEvent(Device device);
StatusOr<std::unique_ptr<StreamMark>> CreateStreamMark(Device device);

// Runs host work on host memory in `stream`'s order: issued on it when it is a queued CPU stream
// (it runs later, on the stream's thread: what it touches must outlive it), otherwise now on the
// caller (no stream, an immediate CPU stream, or a CUDA stream, whose order host memory is not
// in). The CPU kernels, copies and fills go through it.
Status RunOnHostInOrder(Stream* stream, std::function<Status()> work);

// Runs `f` (a clock read for a trace span, say) when `stream` reaches this point: in a CPU
// stream's order (on a queued stream's thread, at once on an immediate one); on a CUDA stream now,
// on the host (its issue time: timing a CUDA stream's own execution needs events).
Status AtStreamPoint(Stream& stream, std::function<void()> f);

// Copies `bytes` between any two of host and CUDA memory. With an asynchronous stream (CUDA, or
// a queued CPU stream) the copy is issued on it (both sides must then stay alive until the stream
// reaches the copy); without one, or on an immediate CPU stream, it has finished when this
// returns. A copy without a stream is not ordered after work still pending on any stream: first
// synchronise the stream that writes the source or reads the destination.
Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream* stream);

// Copies `bytes` of host memory that the caller may change or free as soon as this returns (a
// micro-batch's tokens, in a vector the data loader refills for the next one) to `dst` in
// `stream`'s order: the bytes are taken now, into a snapshot the copy owns (on a queued CPU
// stream, or a CUDA stream, where a host callback frees it once the copy has run), and written
// when the stream reaches the copy. CopyBytes instead reads its source when the stream gets there.
Status CopyFromHostNow(void* dst, Device dst_device, const void* src, size_t bytes, Stream* stream);

// Sets `bytes` bytes at `ptr` to `value`: issued on `stream` when it is asynchronous (a CUDA
// stream for device memory, a queued CPU stream for host memory), otherwise at once.
Status FillBytes(void* ptr, Device device, size_t bytes, uint8_t value, Stream* stream);
inline Status FillZero(void* ptr, Device device, size_t bytes, Stream* stream) {
  return FillBytes(ptr, device, bytes, 0, stream);
}

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
  // The most shared memory a kernel may take a block (cudaDevAttrMaxSharedMemoryPerBlockOptin):
  // 227 KiB on an H100, 163 on an A100, 99 on an RTX 4090 or L40S.
  int64_t shared_memory_per_block = 0;
  // Empty when this build's GPU code runs on it, else why not (runtime/cuda_arch.h).
  std::string unusable_reason;
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
// QueryCuda's entry for the device of that index (its name, memory, shared memory a block); zeros
// and an empty name where there is none (no driver, no such device).
CudaDeviceInfo QueryCudaDevice(int index);

// Dense bf16 peak FLOP/s (no sparsity) of a GPU by its name (CudaDeviceInfo::name), the MFU
// denominator: the datasheets' figures for the H100 (SXM, PCIe, NVL), H200, GH200, H800, H20,
// A100, A800, A30, A40, A10, L4, L40 and L40S; 0 when the name is not known (MFU unknown).
double DenseBf16PeakFlops(std::string_view device_name);
// MFU's denominator in FLOP/s: `given_tflops` (train.peak_tflops) where positive, on any device;
// else a GPU's DenseBf16PeakFlops; 0 (no MFU) on the CPU and for a GPU not known by name.
double PeakFlops(double given_tflops, bool gpu, std::string_view device_name);

// Number of visible CUDA devices (0 without CUDA, driver or device).
int CudaDeviceCount();

// OK when CUDA device `index` is visible and this build's GPU code runs on it ([Note: the GPUs a
// build runs on] in runtime/cuda_arch.h), else FailedPrecondition saying why (which device, its
// compute capability, what the build holds, the CMake option that fixes it).
Status CheckCudaDeviceUsable(int index);

// The device a rank runs on for a choice of "cpu", "cuda" or "" (train.device's; "" for a GPU
// where one runs this build's code): "cuda" takes visible GPU local_rank modulo their number, and
// is FailedPrecondition ("no usable GPU: " and why) where there is none or it cannot run this
// build's code; "" takes that GPU when it can, else the CPU (with a warning when a GPU was
// passed over).
StatusOr<Device> ChooseDevice(std::string_view want, int local_rank);

// Makes `device` current for this host thread (no-op for the CPU).
Status SetCurrentDevice(Device device);

}  // namespace zerort
