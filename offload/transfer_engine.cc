// TransferEngine: device <-> host copies on the copy stream, or on a worker thread on the CPU.
#include "zerort/offload/transfer_engine.h"

#include <cstring>

namespace zerort {

Status Transfer::Finish() {
  if (done_) return done_->Synchronize();
  return task_.Wait();
}

Status Transfer::OrderBefore(Stream& stream) {
  if (done_) return stream.WaitEvent(*done_);
  return task_.Wait();  // CPU streams run work as it is issued: wait here
}

StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(Device device) {
  std::unique_ptr<TransferEngine> e(new TransferEngine());
  e->device_ = device;
  ZR_ASSIGN_OR_RETURN(e->copy_, CreateStream(device, "copy"));
  if (device.is_cpu()) e->pool_ = std::make_unique<TaskPool>(1);
  return e;
}

StatusOr<Transfer> TransferEngine::StartCopy(void* dst, Device dst_device, const void* src,
                                             Device src_device, size_t bytes, Stream* after) {
  Transfer t;
  if (bytes == 0) return t;
  if (device_.is_cpu()) {
    if (!dst_device.is_cpu() || !src_device.is_cpu()) {
      return absl::InvalidArgumentError("a CPU transfer engine copies host memory only");
    }
    t.task_ = pool_->Submit([=]() -> Status {
      std::memcpy(dst, src, bytes);
      return absl::OkStatus();
    });
    return t;
  }
  if (after != nullptr) {
    ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> produced, CreateEvent(device_));
    ZR_RETURN_IF_ERROR(produced->Record(*after));
    ZR_RETURN_IF_ERROR(copy_->WaitEvent(*produced));
  }
  ZR_RETURN_IF_ERROR(CopyBytes(dst, dst_device, src, src_device, bytes, copy_.get()));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, CreateEvent(device_));
  ZR_RETURN_IF_ERROR(done->Record(*copy_));
  t.done_ = std::move(done);
  return t;
}

}  // namespace zerort
