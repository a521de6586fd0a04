// Pipeline schedules as data: what one pipeline stage does in one training step, as a list of
// actions, for GPipe, 1F1B (PipeDream-Flush, Megatron's non-interleaved schedule) and Megatron's
// interleaved 1F1B. A pure function of (schedule, stages p, micro-batches m, virtual stages v,
// stage): the executor runs the list, the tests check the lists, the estimator reads the number
// of micro-batches in flight from them.
//
// Vocabulary: the model's blocks are cut into p x v model chunks; stage s holds chunks s, s + p,
// ..., s + (v - 1) p (its local chunks 0 .. v-1). A micro-batch goes forward through the chunks
// in order, so a forward on stage p-1, local chunk c, sends to stage 0, local chunk c + 1.
//   Forward(mb, c) / Backward(mb, c): one micro-batch through one local chunk
//   RecvForward / SendForward: the activation entering / leaving that forward (none at the first
//     chunk's input and the last chunk's output)
//   RecvBackward / SendBackward: the gradient entering / leaving that backward
// Megatron-LM's warm-up counts (core v0.10 and later): GPipe runs every forward first; 1F1B warms
// up with p - s - 1 forwards (at most m), then alternates one forward and one backward, then
// cools down; the interleaved schedule warms up with (p - s - 1) x 2 + (v - 1) x p forwards (at
// most m v; core v0.9 and earlier ran all m v first when m = p, which raised the later stages'
// activation peak) and orders micro-batches in groups of p per chunk. Bubble: (p - 1) / m for GPipe
// and 1F1B, (p - 1) / (v m) interleaved.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

enum class PipelineSchedule { kGpipe, k1F1B, kInterleaved };
std::string_view PipelineScheduleName(PipelineSchedule s);
// "gpipe", "1f1b" or "interleaved".
StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name);

enum class PipelineOp {
  kRecvForward,
  kForward,
  kSendForward,
  kRecvBackward,
  kBackward,
  kSendBackward
};
std::string_view PipelineOpName(PipelineOp op);

struct PipelineAction {
  PipelineOp op;
  int micro_batch = 0;
  int chunk = 0;  // local model chunk on this stage, 0 .. v-1
  friend bool operator==(const PipelineAction&, const PipelineAction&) = default;
};

struct PipelineShape {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int stages = 1;          // p
  int micro_batches = 1;   // m per step
  int virtual_stages = 1;  // v: model chunks per stage (interleaved only; 1 otherwise)
};

// Fails (InvalidArgument, with the numbers) unless p, m, v >= 1; 1F1B needs m >= p; interleaved
// needs v >= 2 and m a multiple of p (Megatron's requirement); GPipe and 1F1B need v = 1.
Status ValidatePipelineShape(const PipelineShape& shape);

// Forwards stage `stage` runs before its first backward (Megatron's num_warmup_microbatches,
// counted in micro-batch x chunk forwards).
int PipelineWarmup(const PipelineShape& shape, int stage);

// The actions of stage `stage` (0 .. p-1) in one step, in order. Sends and receives are listed
// where the stage needs them; an executor may post them non-blocking in batches, but the order
// of the sends on each link equals the order of the receives at the other end.
StatusOr<std::vector<PipelineAction>> PipelineActions(const PipelineShape& shape, int stage);

// The most micro-batches whose activations a stage holds at once when it runs `actions` as the
// executor does: a micro-batch is held from its first action on the stage (its forward, or the
// receive of its input) to its backward through local chunk 0 (forward-only lists: to its last
// forward). 1F1B: min(p - s, m); GPipe: m; interleaved: more than p on the early stages.
int PipelineLiveMicroBatches(const std::vector<PipelineAction>& actions);

// What a stage holds at once while it runs `actions` (the memory model's inputs): `chunks` gives
// each local chunk's blocks [first, last), `virtual_stages` the chunks per stage.
struct StageLiveness {
  int micro_batches = 1;  // whose activations it holds (PipelineLiveMicroBatches)
  int block_sets = 0;     // block activation sets (a chunk's blocks from its forward to backward)
  // Micro-batches between their first backward (the last local chunk) and their last (chunk 0):
  // the backward scratch's lifetime.
  int backward = 1;
  // Micro-batches between their last local chunk's forward and its backward: the head's logits
  // (on the last stage).
  int head = 1;
};
StageLiveness PipelineStageLiveness(const std::vector<PipelineAction>& actions,
                                    const std::vector<std::pair<int, int>>& chunks,
                                    int virtual_stages);

// What an executor runs, in order: one compute action, one send, or a batch of consecutive
// receives waited for together. Sends are posted without waiting and complete in the background
// once their receive is posted (PointToPoint::PostSend), so a stage waits only at receives: the
// buffered-send semantics under which the tests simulate every schedule. (With sends that
// block until received, no grouping of consecutive actions is deadlock-free for the
// interleaved schedule: the test shows the cycle.)
std::vector<std::vector<PipelineAction>> PipelineBatches(
    const std::vector<PipelineAction>& actions);
bool IsCommunication(PipelineOp op);

// Forward-only (evaluation): every micro-batch through every local chunk in order, with its
// receives and sends.
StatusOr<std::vector<PipelineAction>> PipelineForwardActions(const PipelineShape& shape, int stage);

// The local chunk and stage a forward output of (stage, chunk) goes to; {-1, -1} for the last.
struct ChunkAddress {
  int stage = -1, chunk = -1;
  friend bool operator==(const ChunkAddress&, const ChunkAddress&) = default;
};
ChunkAddress NextChunk(const PipelineShape& shape, int stage, int chunk);
ChunkAddress PreviousChunk(const PipelineShape& shape, int stage, int chunk);

}  // namespace zerort
