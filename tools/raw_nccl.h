// The benchmark baseline for the NCCL backend: raw NCCL calls on a communicator of its own
// (bootstrapped with raw MPI_Bcast), on the caller's device buffers and CUDA stream.
#pragma once

#include <memory>

#include "zerort/runtime/collective_trace.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort::cli {

class RawNccl {
 public:
  virtual ~RawNccl() = default;
  // count is per rank for all_gather / reduce_scatter and the whole buffer for all_reduce; sums.
  virtual Status Run(CollectiveOp op, const void* send, void* recv, size_t count, DType dtype,
                     Stream& stream) = 0;
};

// Collective over MPI_COMM_WORLD (MPI must be initialised).
StatusOr<std::unique_ptr<RawNccl>> CreateRawNccl(Device device);

}  // namespace zerort::cli
