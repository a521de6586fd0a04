// The CUDA half of device.h, implemented by cuda_device.cc or, in a build without CUDA, by
// no_cuda.cc (which answers every call with a clear "built without CUDA" error).
#pragma once

#include <memory>
#include <string>

#include "zerort/runtime/device.h"

namespace zerort::internal {

StatusOr<std::unique_ptr<Stream>> CreateCudaStream(Device device, std::string name);
StatusOr<std::unique_ptr<Event>> CreateCudaEvent(Device device);
StatusOr<std::unique_ptr<StreamMark>> CreateCudaStreamMark(Device device);
Status CudaCopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                     Stream* stream);
Status CudaCopyFromHostNow(void* dst, Device dst_device, const void* src, size_t bytes,
                           Stream* stream);
Status CudaFillBytes(void* ptr, Device device, size_t bytes, uint8_t value, Stream* stream);

}  // namespace zerort::internal
