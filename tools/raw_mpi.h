// The benchmark baseline: the raw MPI call for a collective on MPI_COMM_WORLD, on the caller's
// buffers, with nothing of zerort in between.
#pragma once

#include <cstddef>

#include "zerort/runtime/collective_trace.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort::cli {

// count is per rank for all_gather / reduce_scatter and the whole buffer for all_reduce; sums.
Status RawMpiCollective(CollectiveOp op, const void* send, void* recv, size_t count, DType dtype);

}  // namespace zerort::cli
