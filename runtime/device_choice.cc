// ChooseDevice (device.h): a run's device from train.device's choice; QueryCudaDevice.
#include "zerort/runtime/device.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {

CudaDeviceInfo QueryCudaDevice(int index) {
  for (const CudaDeviceInfo& d : QueryCuda().devices) {
    if (d.index == index) return d;
  }
  return {};
}

StatusOr<Device> ChooseDevice(std::string_view want, int local_rank) {
  if (want == "cpu") return Device::Cpu();
  if (want != "cuda" && !want.empty()) {
    return absl::InvalidArgumentError(
        StrCat("device \"", want, "\" (expected \"cpu\", \"cuda\" or \"\")"));
  }
  const int count = CudaDeviceCount();
  if (count == 0) {
    if (want.empty()) return Device::Cpu();
    return absl::FailedPreconditionError(StrCat("no usable GPU: ", QueryCuda().unavailable_reason));
  }
  const Device gpu = Device::Cuda(local_rank % count);
  const Status usable = CheckCudaDeviceUsable(gpu.index);
  if (usable.ok()) return gpu;
  if (want.empty()) {
    Logger()->warn("running on the CPU: {}", usable.message());
    return Device::Cpu();
  }
  return absl::FailedPreconditionError(StrCat("no usable GPU: ", usable.message()));
}

}  // namespace zerort
