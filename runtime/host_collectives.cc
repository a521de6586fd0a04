// Host values through device memory for any communicator.
#include "zerort/runtime/host_collectives.h"

#include <algorithm>
#include <cstdint>

namespace zerort {

Status AllReduceHostValues(Communicator& comm, Allocator& allocator, Stream& stream, void* values,
                           size_t count, DType dtype, ReduceOp op) {
  const size_t elem = DTypeSize(dtype);
  const size_t chunk = std::max<size_t>(1, std::min(count, kHostValuesChunkBytes / elem));
  const Device dev = allocator.device();
  ZR_ASSIGN_OR_RETURN(Buffer b,
                      allocator.Allocate(chunk * elem, MemoryCategory::kCommBuffers, &stream));
  for (size_t begin = 0; begin < count; begin += chunk) {
    const size_t n = std::min(chunk, count - begin);
    char* at = static_cast<char*>(values) + begin * elem;
    ZR_RETURN_IF_ERROR(CopyBytes(b.data(), dev, at, Device::Cpu(), n * elem, &stream));
    ZR_RETURN_IF_ERROR(comm.AllReduce(b.data(), b.data(), n, dtype, op, &stream));
    ZR_RETURN_IF_ERROR(CopyBytes(at, Device::Cpu(), b.data(), dev, n * elem, &stream));
  }
  return stream.Synchronize();
}

Status AllGatherHostValues(Communicator& comm, Allocator& allocator, Stream& stream,
                           const void* values, void* out, size_t count, DType dtype) {
  const size_t bytes = count * DTypeSize(dtype);
  const Device dev = allocator.device();
  ZR_ASSIGN_OR_RETURN(Buffer in, allocator.Allocate(bytes, MemoryCategory::kCommBuffers, &stream));
  ZR_ASSIGN_OR_RETURN(
      Buffer all, allocator.Allocate(bytes * comm.size(), MemoryCategory::kCommBuffers, &stream));
  ZR_RETURN_IF_ERROR(CopyBytes(in.data(), dev, values, Device::Cpu(), bytes, &stream));
  ZR_RETURN_IF_ERROR(comm.AllGather(in.data(), all.data(), count, dtype, &stream));
  ZR_RETURN_IF_ERROR(CopyBytes(out, Device::Cpu(), all.data(), dev, bytes * comm.size(), &stream));
  return stream.Synchronize();
}

StatusOr<std::vector<std::string>> AllGatherHostStrings(Communicator& comm, Allocator& allocator,
                                                        Stream& stream, const std::string& text) {
  const int64_t length = static_cast<int64_t>(text.size());
  std::vector<int64_t> lengths(static_cast<size_t>(comm.size()));
  ZR_RETURN_IF_ERROR(
      AllGatherHostValues(comm, allocator, stream, &length, lengths.data(), 1, DType::kI64));
  const size_t longest =
      static_cast<size_t>(std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end())));
  std::vector<uint8_t> mine(longest, 0), all(longest * comm.size());
  std::copy(text.begin(), text.end(), mine.begin());
  ZR_RETURN_IF_ERROR(
      AllGatherHostValues(comm, allocator, stream, mine.data(), all.data(), longest, DType::kU8));
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    const char* at = reinterpret_cast<const char*>(all.data() + r * longest);
    out.emplace_back(at, static_cast<size_t>(lengths[r]));
  }
  return out;
}

}  // namespace zerort
