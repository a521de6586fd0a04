// Collectives on host values (a loss, a flag, checksums, a host-tier gradient shard) over any
// backend: the values are staged through the allocator's memory on `stream`, because NCCL takes
// device memory only, in chunks of at most kHostValuesChunkBytes (bounded memory for a large
// shard). The call waits for the result. For decisions every rank must take together, and for
// host buffers a communicator that does not move host memory cannot read.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"

namespace zerort {

inline constexpr size_t kHostValuesChunkBytes = size_t{16} << 20;

Status AllReduceHostValues(Communicator& comm, Allocator& allocator, Stream& stream, void* values,
                           size_t count, DType dtype, ReduceOp op);
// out holds count x comm.size() values, rank-major.
Status AllGatherHostValues(Communicator& comm, Allocator& allocator, Stream& stream,
                           const void* values, void* out, size_t count, DType dtype);
// Every rank's `text`, in rank order (the lengths first, then the texts padded to the longest).
StatusOr<std::vector<std::string>> AllGatherHostStrings(Communicator& comm, Allocator& allocator,
                                                        Stream& stream, const std::string& text);

}  // namespace zerort
