// Without NCCL (or MPI to bootstrap it) there is no raw NCCL baseline.
#include "raw_nccl.h"

namespace zerort::cli {

StatusOr<std::unique_ptr<RawNccl>> CreateRawNccl(Device) {
  return absl::FailedPreconditionError("zerort was built without NCCL and MPI");
}

}  // namespace zerort::cli
