// Raw MPI collectives for the benchmark baseline.
#include "raw_mpi.h"

#include <mpi.h>
#include "zerort/runtime/strings.h"

namespace zerort::cli {

Status RawMpiCollective(CollectiveOp op, const void* send, void* recv, size_t count, DType dtype) {
  if (dtype != DType::kF32) return absl::InvalidArgumentError("the raw MPI baseline uses f32");
  const int n = static_cast<int>(count);
  int rc = MPI_SUCCESS;
  switch (op) {
    case CollectiveOp::kAllGather:
      rc = MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case CollectiveOp::kReduceScatter:
      rc = MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case CollectiveOp::kAllReduce:
      rc = MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    default:
      return absl::InvalidArgumentError("no raw MPI baseline for this operation");
  }
  if (rc != MPI_SUCCESS) return absl::InternalError(StrCat("raw MPI call failed: ", rc));
  return absl::OkStatus();
}

}  // namespace zerort::cli
