// CPU streams and events: work runs when it is issued, so they only keep names and identity.
#include <cstring>

#include "runtime/device.h"
#include "runtime/internal/device_backend.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name) : name_(std::move(name)) {}
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return name_; }
  Status Synchronize() override { return absl::OkStatus(); }
  Status WaitEvent(const Event& event) override {
    if (!event.device().is_cpu()) {
      return absl::InvalidArgumentError(StrCat(
          "CPU stream '", name_, "' cannot wait for an event on ", event.device().ToString()));
    }
    return absl::OkStatus();
  }
  void* native_handle() const override { return nullptr; }

 private:
  std::string name_;
};

class CpuEvent final : public Event {
 public:
  Device device() const override { return Device::Cpu(); }
  Status Record(Stream& stream) override {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(
          StrCat("CPU event recorded on a stream of ", stream.device().ToString()));
    }
    return absl::OkStatus();
  }
  StatusOr<bool> Query() const override { return true; }
  Status Synchronize() const override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }
};

}  // namespace

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : StrCat("cuda:", index);
}

StatusOr<std::unique_ptr<Stream>> CreateStream(Device device, std::string name) {
  if (device.is_cpu()) return std::unique_ptr<Stream>(new CpuStream(std::move(name)));
  return internal::CreateCudaStream(device, std::move(name));
}

StatusOr<std::unique_ptr<Event>> CreateEvent(Device device) {
  if (device.is_cpu()) return std::unique_ptr<Event>(new CpuEvent());
  return internal::CreateCudaEvent(device);
}

Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                 Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  return internal::CudaCopyBytes(dst, dst_device, src, src_device, bytes, stream);
}

Status FillZero(void* ptr, Device device, size_t bytes, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  if (device.is_cpu()) {
    std::memset(ptr, 0, bytes);
    return absl::OkStatus();
  }
  return internal::CudaFillZero(ptr, device, bytes, stream);
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
