// The MPI entry points of a build without MPI.
#include "zerort/runtime/mpi_communicator.h"

namespace zerort {

StatusOr<std::unique_ptr<MpiContext>> MpiContext::Init(int*, char***, Options) {
  return absl::FailedPreconditionError(
      "zerort was built without MPI (install libopenmpi-dev and reconfigure)");
}

struct MpiContext::ExitBarrier {};
MpiContext::MpiContext() = default;
MpiContext::~MpiContext() = default;
void MpiContext::EndAfterError(int, std::chrono::milliseconds) {}

bool MpiContext::thread_multiple() const { return false; }

StatusOr<std::unique_ptr<Communicator>> MpiContext::World(CommOptions) {
  return absl::FailedPreconditionError("zerort was built without MPI");
}

std::string MpiLibraryVersion() { return "not built"; }

}  // namespace zerort
