// NCCL backend: CUDA buffers on CUDA streams. The ncclUniqueId is broadcast over a bootstrap
// communicator (MPI in a multi-process run, loopback for ranks on one GPU in tests). The NCCL
// communicator is non-blocking (ncclConfig_t.blocking = 0): host calls return at once and the
// watchdog polls an event recorded after each operation plus ncclCommGetAsyncError, aborting
// the communicator (ncclCommAbort) when a deadline passes. No NCCL or CUDA header here.
#pragma once

#include <memory>
#include <string>

#include "zerort/runtime/communicator.h"

namespace zerort {

// Collective over `bootstrap`: every rank passes its own CUDA device.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                               Device device, CommOptions options,
                                                               Watchdog* watchdog);

std::string NcclVersion();  // "2.27.7", or why there is none

}  // namespace zerort
