// Loopback backend: N ranks as N threads of one process sharing memory, for tests and for
// single-process runs that want the sharded code path. Collectives rendezvous on a shared group
// object; each rank computes its own part straight from the others' buffers. A rank whose peers
// do not arrive in time fails with DeadlineExceeded (or, with a watchdog, the process exits 3);
// a rank calling a different collective than its peers gets an error naming both calls.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "runtime/communicator.h"

namespace zerort {

// `size` communicators of one group; communicator i is rank i and belongs to one thread.
// `watchdog` may be null: timeouts then surface as DeadlineExceeded errors.
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLoopbackGroup(int size,
                                                                         CommOptions options,
                                                                         Watchdog* watchdog);

// Runs `body` on `size` threads, one loopback rank each, and returns the first error (by rank).
Status RunLoopbackRanks(int size, CommOptions options, Watchdog* watchdog,
                        const std::function<Status(Communicator&)>& body);

}  // namespace zerort
