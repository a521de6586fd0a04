// Device-independent parts of device.h; CPU streams and events are in cpu_streams.cc.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "zerort/runtime/device.h"
#include "zerort/runtime/internal/cpu_streams.h"
#include "zerort/runtime/internal/device_backend.h"
#include "zerort/runtime/strings.h"

namespace zerort {

Status RunOnHostInOrder(Stream* stream, std::function<Status()> work) {
  if (internal::IsQueuedCpu(stream)) return stream->Launch(std::move(work));
  return work();
}

Status AtStreamPoint(Stream& stream, std::function<void()> f) {
  if (stream.device().is_cuda()) {
    f();
    return absl::OkStatus();
  }
  return stream.Launch([f = std::move(f)] {
    f();
    return absl::OkStatus();
  });
}

Status Stream::Launch(std::function<Status()> work) {
  return absl::UnimplementedError(StrCat("host work on stream '", name(), "' of ",
                                         device().ToString(),
                                         ": only CPU streams run host work in their order"));
}

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : StrCat("cuda:", index);
}

StatusOr<std::unique_ptr<Stream>> CreateStream(Device device, std::string name,
                                               const StreamOptions& options) {
  if (device.is_cpu()) return internal::CreateCpuStream(std::move(name), options);
  return internal::CreateCudaStream(device, std::move(name));
}

StatusOr<std::unique_ptr<Event>> CreateEvent(Device device) {
  if (device.is_cpu()) return internal::CreateCpuEvent();
  return internal::CreateCudaEvent(device);
}

namespace {

// The host's steady clock read where the stream reaches the mark ([Note: stream marks]).
class CpuStreamMark final : public StreamMark {
 public:
  Device device() const override { return Device::Cpu(); }
  Status Record(Stream& stream) override {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(
          StrCat("a CPU stream mark recorded on a stream of ", stream.device().ToString()));
    }
    auto at = std::make_shared<std::atomic<int64_t>>(kNotReached);
    at_ = at;
    return AtStreamPoint(stream, [at] {
      at->store(std::chrono::steady_clock::now().time_since_epoch().count(),
                std::memory_order_release);
    });
  }
  StatusOr<double> SecondsSince(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const CpuStreamMark*>(&earlier);
    if (e == nullptr) {
      return absl::InvalidArgumentError(
          StrCat("stream marks of cpu and ", earlier.device().ToString()));
    }
    ZR_ASSIGN_OR_RETURN(const int64_t end, Reached());
    ZR_ASSIGN_OR_RETURN(const int64_t begin, e->Reached());
    return std::chrono::duration<double>(std::chrono::steady_clock::duration(end - begin)).count();
  }

 private:
  static constexpr int64_t kNotReached = std::numeric_limits<int64_t>::min();
  StatusOr<int64_t> Reached() const {
    const int64_t t = at_ ? at_->load(std::memory_order_acquire) : kNotReached;
    if (t == kNotReached) {
      return absl::FailedPreconditionError(
          at_ ? "a stream mark read before its stream reached it (synchronize the stream first)"
              : "a stream mark read before it was recorded");
    }
    return t;
  }
  std::shared_ptr<std::atomic<int64_t>> at_;  // shared with the stream's pending clock read
};

}  // namespace

StatusOr<std::unique_ptr<StreamMark>> CreateStreamMark(Device device) {
  if (device.is_cpu()) return std::unique_ptr<StreamMark>(new CpuStreamMark());
  return internal::CreateCudaStreamMark(device);
}

Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    return RunOnHostInOrder(stream, [=] {
      std::memmove(dst, src, bytes);
      return absl::OkStatus();
    });
  }
  return internal::CudaCopyBytes(dst, dst_device, src, src_device, bytes, stream);
}

Status CopyFromHostNow(void* dst, Device dst_device, const void* src, size_t bytes,
                       Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cuda())
    return internal::CudaCopyFromHostNow(dst, dst_device, src, bytes, stream);
  if (!internal::IsQueuedCpu(stream)) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  const auto* s = static_cast<const std::byte*>(src);
  auto snapshot = std::make_shared<const std::vector<std::byte>>(s, s + bytes);
  return stream->Launch([dst, snapshot] {
    std::memcpy(dst, snapshot->data(), snapshot->size());
    return absl::OkStatus();
  });
}

Status FillBytes(void* ptr, Device device, size_t bytes, uint8_t value, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (device.is_cpu()) {
    return RunOnHostInOrder(stream, [=] {
      std::memset(ptr, value, bytes);
      return absl::OkStatus();
    });
  }
  return internal::CudaFillBytes(ptr, device, bytes, value, stream);
}

double DenseBf16PeakFlops(std::string_view name) {
  if (name.find("H100") != std::string_view::npos) {
    return name.find("PCIe") != std::string_view::npos ? 756e12 : 989e12;
  }
  if (name.find("H200") != std::string_view::npos) return 989e12;
  if (name.find("A100") != std::string_view::npos) return 312e12;
  return 0;
}

}  // namespace zerort
