// Host values through device memory for any communicator.
#include "runtime/host_collectives.h"

namespace zerort {

Status AllReduceHostValues(Communicator& comm, Allocator& allocator, Stream& stream, void* values,
                           size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * DTypeSize(dtype);
  const Device dev = allocator.device();
  ZR_ASSIGN_OR_RETURN(Buffer b, allocator.Allocate(bytes, MemoryCategory::kCommBuffers, &stream));
  ZR_RETURN_IF_ERROR(CopyBytes(b.data(), dev, values, Device::Cpu(), bytes, &stream));
  ZR_RETURN_IF_ERROR(comm.AllReduce(b.data(), b.data(), count, dtype, op, &stream));
  ZR_RETURN_IF_ERROR(CopyBytes(values, Device::Cpu(), b.data(), dev, bytes, &stream));
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

}  // namespace zerort
