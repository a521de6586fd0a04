// Device-independent parts of device.h; CPU streams and events are in cpu_streams.cc.
#include <algorithm>
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
  // The datasheets' dense bf16 tensor-core figures (without sparsity, fp32 accumulation), by the
  // name's words as the driver reports them ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
  // "NVIDIA H100 PCIe", "NVIDIA L40S"): whole words, so an A10G is not an A10 nor an A100.
  struct Peak {
    std::string_view model;
    double sxm, pcie, nvl;  // the form's figure; 0: the first one's
  };
  static constexpr Peak kPeaks[] = {{"H100", 989e12, 756e12, 835e12},
                                    {"H200", 989e12, 0, 835e12},
                                    {"GH200", 989e12, 0, 0},
                                    {"H800", 989e12, 756e12, 0},
                                    {"H20", 148e12, 0, 0},
                                    {"A100", 312e12, 0, 0},
                                    {"A800", 312e12, 0, 0},
                                    {"A30", 165e12, 0, 0},
                                    {"A40", 149.7e12, 0, 0},
                                    {"A10", 125e12, 0, 0},
                                    {"L4", 121e12, 0, 0},
                                    {"L40", 181.05e12, 0, 0},
                                    {"L40S", 362.05e12, 0, 0}};
  std::vector<std::string_view> words;
  for (size_t at = 0; at < name.size();) {
    const size_t end = std::min(name.find_first_of(" -", at), name.size());
    if (end > at) words.push_back(name.substr(at, end - at));
    at = end + 1;
  }
  const auto has = [&](std::string_view w) {
    return std::find(words.begin(), words.end(), w) != words.end();
  };
  for (const Peak& p : kPeaks) {
    if (!has(p.model)) continue;
    if (p.nvl > 0 && has("NVL")) return p.nvl;
    if (p.pcie > 0 && (has("PCIe") || has("PCIE"))) return p.pcie;
    return p.sxm;
  }
  return 0;
}

double PeakFlops(double given_tflops, bool gpu, std::string_view device_name) {
  if (given_tflops > 0) return given_tflops * 1e12;
  return gpu ? DenseBf16PeakFlops(device_name) : 0.0;
}

}  // namespace zerort
