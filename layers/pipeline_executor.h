// PipelineExecutor: runs one pipeline stage of a DecoderModel through a schedule's actions
// (pipeline_schedule.h). Each micro-batch's activations live in a DecoderStages::MicroBatch from
// its first forward on this stage to its last backward here; receives are waited for in batches
// (PointToPoint::Exchange), sends are posted (PointToPoint::PostSend) from copies the executor
// owns until the backend reports them complete, so a MicroBatch can go as soon as its backward
// ends. Every point-to-point runs under the watchdog's deadline like the collectives. On an
// asynchronous device the transfers run on streams of their own, beside the compute ([Note:
// pipeline transfers on streams of their own], pipeline_executor.cc).
//
// Scatter/gather (Megatron's optimisation of cross-stage sends): without sequence parallelism
// the boundary activation is the same on every tensor-parallel rank, so each sends 1/tp of it
// and the receiving stage all-gathers the pieces over its tensor-parallel group: tp-fold fewer
// bytes between stages. Under sequence parallelism each rank's rows are already its own 1/tp.
//
// Losses: the last stage computes them; Train and Evaluate return the sum of the micro-batches'
// mean losses there and 0 on the other stages (the caller reduces over the pipeline group).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerort/layers/decoder_model.h"
#include "zerort/layers/pipeline_links.h"
#include "zerort/layers/pipeline_schedule.h"
#include "zerort/layers/tensor_parallel.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"

namespace zerort {

// The blocks of every model chunk of stage `stage`: p x v chunks in model order, `layers[k]`
// blocks in chunk k (an even split when empty); stage s holds chunks s, s + p, ... (its local
// chunks 0 .. v-1). Fails with the numbers when they do not split.
StatusOr<std::vector<std::pair<int, int>>> StageChunks(int n_layer, int stages, int virtual_stages,
                                                       std::span<const int> layers, int stage);

struct PipelineStageOptions {
  PipelineShape shape;  // schedule, p, m, v
  int stage = 0;        // this rank's pipeline coordinate
  // rank == stage; null when one stage. Its collectives (the loss); the transfers go over
  // links split from it at Create ([Note: pipeline links]).
  Communicator* pipeline = nullptr;
  TensorParallelGroup tp = {};              // the scatter/gather's all-gather
  bool sequence_parallel = false;           // boundaries already split by rows
  bool scatter_gather = true;               // send 1/tp of a replicated boundary
  std::vector<std::pair<int, int>> chunks;  // the model's DecoderStagePart::chunks
  Allocator* allocator = nullptr;           // send copies and received gradients
  Stream* stream = nullptr;                 // the model's compute stream
  // How the links' own streams run on a CPU device (queued, as the compute stream must then be;
  // this jitter): [Note: pipeline transfers on streams of their own].
  StreamOptions streams = {};
  SpanSink span;  // optional
  // Fault injection for the hang tests: stage `fail_send_stage` skips its first send (never
  // posts it) or, with `fail_send_dies`, exits at it, as a crashed or buggy stage would.
  int fail_send_stage = -1;
  bool fail_send_dies = false;
};

struct PipelineData {
  std::span<const int32_t> tokens, targets;  // [batch, seq] each
};

class PipelineExecutor {
 public:
  ~PipelineExecutor();
  static StatusOr<std::unique_ptr<PipelineExecutor>> Create(DecoderModel& model,
                                                            PipelineStageOptions options);

  // One training step over data.size() == micro_batches micro-batches: gradients of
  // loss_scale x each micro-batch's mean loss are added to the store.
  StatusOr<double> Train(std::span<const PipelineData> data, int batch, int seq, float loss_scale);
  // Forward only, any number of micro-batches.
  StatusOr<double> Evaluate(std::span<const PipelineData> data, int batch, int seq);
  // Continues `prompt` on every stage: the last stage samples each token and broadcasts it.
  StatusOr<std::vector<int32_t>> Generate(std::vector<int32_t> prompt, int new_tokens,
                                          const SamplingOptions& sampling);

  void SetSpanSink(SpanSink span) { options_.span = std::move(span); }
  // Bytes this rank sent to other stages so far (the scatter/gather's measurement).
  int64_t bytes_sent() const { return bytes_sent_; }
  const PipelineStageOptions& options() const { return options_; }

 private:
  PipelineExecutor(DecoderModel& model, PipelineStageOptions options, PipelineLinks links);
  struct Step;
  StatusOr<double> Run(const std::vector<PipelineAction>& actions,
                       std::span<const PipelineData> data, int batch, int seq, bool train,
                       float loss_scale);
  Status RunActions(Step& step, const std::vector<PipelineAction>& actions);
  Status Compute(Step& step, const PipelineAction& a);
  Status Send(Step& step, const PipelineAction& a);
  Status Receive(Step& step, const std::vector<PipelineAction>& batch);
  Status ReleaseSent();  // send copies whose sends completed
  // [Note: pipeline transfers on streams of their own]
  Status CreateLinkStreams();
  Stream* StreamOf(Communicator* link) const;  // null: the transfers are posted and exchanged
  Status SendOnLinkStream(Communicator& link, const void* data, int64_t count, DType dtype,
                          std::unique_ptr<Event>& sent);
  Status ReceiveOnLinkStream(Communicator& link, std::span<const P2POp> recvs,
                             std::span<const std::string> labels, DType dtype);
  StatusOr<std::unique_ptr<Event>> TakeEvent();  // from spare_events_, or a new one
  Status FinishTransfers();                      // a step's end: every transfer complete
  Communicator* To(int stage) const;             // the link to a neighbour ([Note: pipeline links])
  Communicator* From(int stage) const;           // the link from one
  bool FirstChunk(int chunk) const;              // the model's first chunk (it embeds)
  bool LastChunk(int chunk) const;               // the model's last chunk (it has the head)
  // The part of a boundary of `n` elements this rank sends and receives: all of it, or its
  // 1/tp (scatter/gather): {offset, count}.
  std::pair<int64_t, int64_t> Slice(int64_t n) const;

  DecoderStages& stages_;  // the model's
  PipelineStageOptions options_;
  PipelineLinks links_;
  // Send copies per link, oldest first, each kept until its send has completed: posted sends
  // (`sent` null) by the link's count of posted sends, sends on a link's stream by `sent`.
  struct InFlight {
    Buffer copy;
    std::unique_ptr<Event> sent;
  };
  std::map<Communicator*, std::deque<InFlight>> in_flight_;
  struct LinkStream {
    std::unique_ptr<Stream> stream;   // "p2p to stage t" / "p2p from stage t"
    std::unique_ptr<Event> received;  // receive streams: a batch's end, for the compute stream
  };
  std::map<Communicator*, LinkStream> link_streams_;  // empty: posted and exchanged
  std::unique_ptr<Event> compute_ready_;  // the compute work a transfer on a link waits for
  std::vector<std::unique_ptr<Event>> spare_events_;
  // Steps that failed while transfers on the links' streams might still use their buffers: kept
  // until the executor goes (its links' streams are drained first).
  std::vector<std::unique_ptr<Step>> abandoned_;
  int64_t bytes_sent_ = 0;
  bool failed_send_ = false;  // the injected fault happened
};

}  // namespace zerort
