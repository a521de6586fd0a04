// The NCCL entry points of a build without NCCL.
#include "zerort/runtime/nccl_communicator.h"

namespace zerort {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&, Device, CommOptions,
                                                               Watchdog*) {
  return absl::FailedPreconditionError(
      "zerort was built without NCCL (needs CUDA and NCCL; reconfigure with -DZR_ENABLE_NCCL=ON)");
}

std::string NcclVersion() { return "not built"; }

}  // namespace zerort
