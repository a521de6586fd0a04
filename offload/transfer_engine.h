// TransferEngine: copies between device memory and host memory on the copy stream (docs/design.md,
// "Streams, events and overlap": it exists to overlap host and NVMe transfers with compute and
// communication), as Start/Finish pairs. CUDA: cudaMemcpyAsync on the copy stream after an event of
// the stream that produced the source. CPU device: a memcpy on a worker thread, so the overlap is
// real there too.
#pragma once

#include <memory>

#include "zerort/offload/task_pool.h"
#include "zerort/runtime/device.h"

namespace zerort {

// One copy in flight. Finish() waits for it on the host; idempotent.
class Transfer {
 public:
  Transfer() = default;  // nothing in flight
  Status Finish();
  // Makes later work on `stream` wait for the copy without blocking the host.
  Status OrderBefore(Stream& stream);

 private:
  friend class TransferEngine;
  Task task_;                    // CPU device
  std::shared_ptr<Event> done_;  // CUDA: recorded on the copy stream after the copy
};

class TransferEngine {
 public:
  static StatusOr<std::unique_ptr<TransferEngine>> Create(Device device);

  // Copies `bytes` once the work issued so far on `after` (nullptr: nothing) has finished.
  StatusOr<Transfer> StartCopy(void* dst, Device dst_device, const void* src, Device src_device,
                               size_t bytes, Stream* after);
  Stream& copy_stream() { return *copy_; }
  Device device() const { return device_; }

 private:
  TransferEngine() = default;
  Device device_;
  std::unique_ptr<Stream> copy_;
  std::unique_ptr<TaskPool> pool_;  // CPU device
};

}  // namespace zerort
