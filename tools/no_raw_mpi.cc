// Without MPI there is no raw MPI baseline.
#include "raw_mpi.h"

namespace zerort::cli {

Status RawMpiCollective(CollectiveOp, const void*, void*, size_t, DType) {
  return absl::FailedPreconditionError("zerort was built without MPI");
}

}  // namespace zerort::cli
