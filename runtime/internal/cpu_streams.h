// The CPU half of device.h: immediate streams (work runs when it is issued) and queued streams
// (the cpu-async device: a worker thread per stream), and the CPU event both record.
#pragma once

#include <memory>
#include <string>

#include "zerort/runtime/device.h"

namespace zerort::internal {

std::unique_ptr<Stream> CreateCpuStream(std::string name, const StreamOptions& options);
// A queued CPU stream: host work issued on it runs later, on its thread.
inline bool IsQueuedCpu(const Stream* stream) {
  return stream != nullptr && stream->device().is_cpu() && stream->asynchronous();
}
std::unique_ptr<Event> CreateCpuEvent();

}  // namespace zerort::internal
