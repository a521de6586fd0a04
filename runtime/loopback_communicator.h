// Loopback backend: N ranks as N threads of one process sharing memory, for tests and for
// single-process runs that want the sharded code path. Collectives rendezvous on a shared group
// object; each rank computes its own part straight from the others' buffers. A rank whose peers
// do not arrive in time fails with DeadlineExceeded (or, with a watchdog, the process exits 3);
// a rank calling a different collective than its peers gets an error naming both calls.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "zerort/runtime/communicator.h"

namespace zerort {

// How sends complete.
enum class LoopbackSends {
  // A send is complete when posted (its data is copied into the receiver's mailbox), as MPI's
  // buffered sends of small messages: a rank never waits for its own sends.
  kBuffered,
  // NCCL's semantics: a send completes only when its receiver takes it, and a communicator runs
  // its operations in issue order, so every later operation of the sending rank on the same
  // communicator (a receive, an exchange, a collective, WaitSends) first waits for its earlier
  // sends to be received. Posting sends does not wait. This makes orderings that deadlock under
  // NCCL once messages exceed its buffers (two ranks that each post a send to the other, then
  // receive on the same communicator) fail on the CPU with a DeadlineExceeded naming the send.
  kRendezvous,
};

// `size` communicators of one group; communicator i is rank i and belongs to one thread.
// `watchdog` may be null: timeouts then surface as DeadlineExceeded errors. Groups split from
// them keep `sends`.
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLoopbackGroup(
    int size, CommOptions options, Watchdog* watchdog,
    LoopbackSends sends = LoopbackSends::kBuffered);

// Runs `body` on `size` threads, one loopback rank each, and returns the first error (by rank).
Status RunLoopbackRanks(int size, CommOptions options, Watchdog* watchdog,
                        const std::function<Status(Communicator&)>& body,
                        LoopbackSends sends = LoopbackSends::kBuffered);

}  // namespace zerort
