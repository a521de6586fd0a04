// PipelineLinks: one communicator per directed link between neighbouring pipeline stages, for
// the pipeline executor's transfers ([Note: pipeline links]).
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "zerort/runtime/communicator.h"

namespace zerort {

// [Note: pipeline links]
// The executor's sends and receives go over one communicator per directed link s -> t between
// ring neighbours (t = s + 1 or s - 1 mod p), in which the sender is rank 0 and the receiver
// rank 1, never over the pipeline group itself. NCCL runs a communicator's operations in issue
// order and a send ends only when its receiver takes it; on one communicator, 1F1B at p 2, m 2
// deadlocks once a boundary exceeds NCCL's buffers (about 6 MB for GPT-2 small in bf16): stage
// 0 posts forward 1 and then receives backward 0, stage 1 posts backward 0 and then receives
// forward 1, and each receive waits behind its rank's own unreceived send. On a directed link a
// rank only sends or only receives, so a receive never waits behind a send of its own rank. The
// loopback backend's LoopbackSends::kRendezvous has NCCL's semantics, so the deadlock (and its
// absence here) shows on the CPU (decoder_pipeline_test). MPI and buffered loopback sends complete
// when posted and never needed this; they use the same links. Megatron-LM avoids the same cycle
// by batching each send with the receive that follows (batch_isend_irecv).
class PipelineLinks {
 public:
  PipelineLinks() = default;
  // Collective over `pipeline` (rank == stage): split rounds that give every rank its links to
  // and from both ring neighbours (p = 2: one each way). Nothing for one stage.
  static StatusOr<PipelineLinks> Create(Communicator& pipeline);

  // The link to / from neighbour `stage`, or null when there is none. On it, this rank's peer is
  // rank 1 (to) or 0 (from).
  Communicator* To(int stage) const;
  Communicator* From(int stage) const;
  // Every link this rank sends on (outgoing) or receives on (incoming), with the neighbour's
  // stage, in stage order.
  std::vector<std::pair<int, Communicator*>> outgoing() const;
  std::vector<std::pair<int, Communicator*>> incoming() const;

  static constexpr int kReceiverRank = 1;
  static constexpr int kSenderRank = 0;

 private:
  std::map<int, std::unique_ptr<Communicator>> to_, from_;
};

}  // namespace zerort
