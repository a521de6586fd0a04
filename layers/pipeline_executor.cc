// PipelineExecutor: one stage's actions over a DecoderModel.
#include "zerort/layers/pipeline_executor.h"

#include <cstdlib>
#include <map>
#include <numeric>
#include <random>

#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<std::vector<std::pair<int, int>>> StageChunks(int n_layer, int stages, int virtual_stages,
                                                       std::span<const int> layers, int stage) {
  const int chunks = stages * virtual_stages;
  if (stages < 1 || virtual_stages < 1 || stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(
        StrCat("stage ", stage, " of ", stages, " x ", virtual_stages, " chunks"));
  }
  std::vector<int> sizes(layers.begin(), layers.end());
  if (sizes.empty()) {
    if (n_layer % chunks != 0) {
      return absl::InvalidArgumentError(StrCat(n_layer, " blocks do not split into ", stages,
                                               " stages x ", virtual_stages, " chunks evenly"));
    }
    sizes.assign(chunks, n_layer / chunks);
  }
  if (static_cast<int>(sizes.size()) != chunks) {
    return absl::InvalidArgumentError(
        StrCat(sizes.size(), " chunk sizes for ", stages, " x ", virtual_stages, " chunks"));
  }
  int64_t sum = 0;
  for (int s : sizes) {
    if (s < 1) return absl::InvalidArgumentError(StrCat("a chunk of ", s, " blocks"));
    sum += s;
  }
  if (sum != n_layer) {
    return absl::InvalidArgumentError(
        StrCat("chunk sizes sum to ", sum, ", the model has ", n_layer, " blocks"));
  }
  std::vector<std::pair<int, int>> out;
  int begin = 0;
  for (int k = 0; k < chunks; ++k) {
    if (k % stages == stage) out.emplace_back(begin, begin + sizes[k]);
    begin += sizes[k];
  }
  return out;
}

StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(DecoderModel& model,
                                                                     PipelineStageOptions options) {
  const PipelineShape& s = options.shape;
  ZR_RETURN_IF_ERROR(ValidatePipelineShape(s));
  if (options.stage < 0 || options.stage >= s.stages) {
    return absl::InvalidArgumentError(StrCat("pipeline stage ", options.stage, " of ", s.stages));
  }
  if (s.stages > 1 && (options.pipeline == nullptr || options.pipeline->size() != s.stages ||
                       options.pipeline->rank() != options.stage)) {
    return absl::InvalidArgumentError(
        StrCat("stage ", options.stage, " of ", s.stages,
               " needs a pipeline group of that size in which it has that rank"));
  }
  if (static_cast<int>(options.chunks.size()) != s.virtual_stages) {
    return absl::InvalidArgumentError(StrCat(options.chunks.size(), " model chunks on a stage of ",
                                             s.virtual_stages, " virtual stages"));
  }
  if (options.chunks != model.options().stage.chunks &&
      !(model.options().stage.chunks.empty() && s.stages == 1 && s.virtual_stages == 1)) {
    return absl::InvalidArgumentError("the executor's chunks are not the model's");
  }
  if (options.allocator == nullptr || options.stream == nullptr) {
    return absl::InvalidArgumentError("the pipeline executor needs an allocator and a stream");
  }
  PipelineLinks links;
  if (s.stages > 1) {
    ZR_ASSIGN_OR_RETURN(links, PipelineLinks::Create(*options.pipeline));
  }
  std::unique_ptr<PipelineExecutor> executor(
      new PipelineExecutor(model, std::move(options), std::move(links)));
  ZR_RETURN_IF_ERROR(executor->CreateLinkStreams());
  return executor;
}

PipelineExecutor::PipelineExecutor(DecoderModel& model, PipelineStageOptions options,
                                   PipelineLinks links)
    : stages_(model.stages()), options_(std::move(options)), links_(std::move(links)) {}

PipelineExecutor::~PipelineExecutor() {
  // A failed step's transfers may still be using its buffers (abandoned_): let them end first.
  for (auto& [link, ls] : link_streams_) (void)ls.stream->Synchronize();
}

bool PipelineExecutor::FirstChunk(int chunk) const {
  return PreviousChunk(options_.shape, options_.stage, chunk).stage < 0;
}

bool PipelineExecutor::LastChunk(int chunk) const {
  return NextChunk(options_.shape, options_.stage, chunk).stage < 0;
}

std::pair<int64_t, int64_t> PipelineExecutor::Slice(int64_t n) const {
  const int t = options_.tp.size();
  if (!options_.scatter_gather || options_.sequence_parallel || t == 1 || n % t != 0) {
    return {0, n};
  }
  return {options_.tp.rank() * (n / t), n / t};
}

// One step's state on this stage.
struct PipelineExecutor::Step {
  std::span<const PipelineData> data;
  int batch = 0, seq = 0;
  bool train = false;
  float loss_scale = 1.0f;
  std::vector<DecoderStages::MicroBatchPtr> mbs;
  std::map<std::pair<int, int>, Buffer> grad_in;   // received gradients, per (micro-batch, chunk)
  std::map<std::pair<int, int>, Buffer> grad_out;  // computed input gradients, to send
  double loss = 0;
};

Status PipelineExecutor::ReleaseSent() {
  for (auto& [link, copies] : in_flight_) {
    if (StreamOf(link) == nullptr) {
      while (copies.size() > link->p2p().posted_sends()) copies.pop_front();
      continue;
    }
    while (!copies.empty() && copies.front().sent != nullptr) {
      ZR_ASSIGN_OR_RETURN(const bool done, copies.front().sent->Query());
      if (!done) break;
      spare_events_.push_back(std::move(copies.front().sent));
      copies.pop_front();
    }
  }
  return absl::OkStatus();
}

// [Note: pipeline transfers on streams of their own]
// Where a link's Send and Recv leave the host free -- on a queued CPU stream (cpu-async) they
// run on that stream's thread, on a CUDA stream NCCL enqueues them -- every directed link
// ([Note: pipeline links]) has a stream of its own: "p2p to stage t" carries this stage's sends
// to t, "p2p from stage t" its receives from t.
//  - A send waits (an event) for the compute work issued before it, which wrote its buffer (the
//    copy of a forward's boundary, or the input gradient a backward wrote), then runs in its
//    link stream's order; the buffer is kept until an event recorded after the send completes.
//  - A batch of receives waits for the compute work issued before it (the buffers were
//    allocated in the compute stream's order, and a block may have just been freed there), runs
//    on each link's receive stream, and the compute stream waits for it before the work that
//    reads what it received.
// So the transfers run beside the compute, as on a GPU: they are on their own tracks of the
// trace, and only the compute stream's waits for them count as exposed communication ([Note:
// exposed communication], engine/comm_spans.h). A send that waits for its receiver holds up only
// later sends on its link, which the receiver takes in the same order: no cycle forms. A step
// ends by synchronising the links' streams, so their errors (a receive that timed out) are the
// step's; a step that fails keeps its buffers (abandoned_) instead of waiting for transfers a
// failed peer may never complete. Elsewhere -- the synchronous CPU, whose streams run on the
// host, and CUDA buffers over a host backend (MPI, loopback), whose blocking send would hold the
// host -- sends are posted (PostSend) and receives exchanged (Exchange) on the compute stream.
Status PipelineExecutor::CreateLinkStreams() {
  const Stream& compute = *options_.stream;
  const auto outgoing = links_.outgoing(), incoming = links_.incoming();
  if (!compute.asynchronous() || outgoing.empty()) return absl::OkStatus();
  if (compute.device().is_cuda() && outgoing.front().second->moves_host_memory()) {
    return absl::OkStatus();
  }
  StreamOptions streams = options_.streams;
  streams.cpu = CpuExecution::kQueued;
  for (const auto& [stage, link] : outgoing) {
    ZR_ASSIGN_OR_RETURN(link_streams_[link].stream,
                        CreateStream(compute.device(), StrCat("p2p to stage ", stage), streams));
  }
  for (const auto& [stage, link] : incoming) {
    LinkStream& ls = link_streams_[link];
    ZR_ASSIGN_OR_RETURN(ls.stream,
                        CreateStream(compute.device(), StrCat("p2p from stage ", stage), streams));
    ZR_ASSIGN_OR_RETURN(ls.received, CreateEvent(compute.device()));
  }
  ZR_ASSIGN_OR_RETURN(compute_ready_, CreateEvent(compute.device()));
  return absl::OkStatus();
}

Stream* PipelineExecutor::StreamOf(Communicator* link) const {
  auto it = link_streams_.find(link);
  return it == link_streams_.end() ? nullptr : it->second.stream.get();
}

StatusOr<std::unique_ptr<Event>> PipelineExecutor::TakeEvent() {
  if (spare_events_.empty()) return CreateEvent(options_.stream->device());
  std::unique_ptr<Event> e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

Status PipelineExecutor::SendOnLinkStream(Communicator& link, const void* data, int64_t count,
                                          DType dtype, std::unique_ptr<Event>& sent) {
  Stream& on = *StreamOf(&link);
  ZR_RETURN_IF_ERROR(compute_ready_->Record(*options_.stream));  // what wrote `data`
  ZR_RETURN_IF_ERROR(on.WaitEvent(*compute_ready_));
  ZR_RETURN_IF_ERROR(link.p2p().Send(data, count, dtype, PipelineLinks::kReceiverRank, &on));
  ZR_ASSIGN_OR_RETURN(sent, TakeEvent());
  return sent->Record(on);
}

Status PipelineExecutor::ReceiveOnLinkStream(Communicator& link, std::span<const P2POp> recvs,
                                             std::span<const std::string> labels, DType dtype) {
  LinkStream& ls = link_streams_.at(&link);
  ZR_RETURN_IF_ERROR(compute_ready_->Record(*options_.stream));  // the buffers' earlier users
  ZR_RETURN_IF_ERROR(ls.stream->WaitEvent(*compute_ready_));
  for (size_t i = 0; i < recvs.size(); ++i) {
    link.recorder().SetLabel(labels[i]);
    const Status received =
        link.p2p().Recv(recvs[i].buffer, recvs[i].count, dtype, recvs[i].peer, ls.stream.get());
    link.recorder().SetLabel("");
    ZR_RETURN_IF_ERROR(received);
  }
  ZR_RETURN_IF_ERROR(ls.received->Record(*ls.stream));
  return options_.stream->WaitEvent(*ls.received);
}

Status PipelineExecutor::FinishTransfers() {
  for (auto& [link, ls] : link_streams_) ZR_RETURN_IF_ERROR(ls.stream->Synchronize());
  for (const auto& [stage, link] : links_.outgoing()) {
    if (StreamOf(link) == nullptr) ZR_RETURN_IF_ERROR(link->p2p().WaitSends());
  }
  for (auto& [link, copies] : in_flight_) {
    for (InFlight& f : copies) {
      if (f.sent != nullptr) spare_events_.push_back(std::move(f.sent));
    }
  }
  in_flight_.clear();
  return absl::OkStatus();
}

Communicator* PipelineExecutor::To(int stage) const {
  Communicator* link = links_.To(stage);
  ZR_CHECK(link != nullptr) << "no pipeline link from stage " << options_.stage << " to " << stage;
  return link;
}

Communicator* PipelineExecutor::From(int stage) const {
  Communicator* link = links_.From(stage);
  ZR_CHECK(link != nullptr) << "no pipeline link to stage " << options_.stage << " from " << stage;
  return link;
}

Status PipelineExecutor::Compute(Step& step, const PipelineAction& a) {
  // The span runs from when the compute stream starts the action to when it has run (CPU
  // streams) or issued (CUDA) all of it: AtStreamPoint.
  using Clock = std::chrono::system_clock;
  auto began = std::make_shared<Clock::time_point>();
  if (options_.span)
    ZR_RETURN_IF_ERROR(AtStreamPoint(*options_.stream, [began] { *began = Clock::now(); }));
  const auto [first, last] = options_.chunks[a.chunk];
  auto& mb = step.mbs[a.micro_batch];
  if (a.op == PipelineOp::kForward) {
    if (!mb) {
      const PipelineData& d = step.data[a.micro_batch];
      ZR_ASSIGN_OR_RETURN(mb, stages_.Begin(d.tokens, d.targets, step.batch, step.seq, step.train));
    }
    if (FirstChunk(a.chunk)) ZR_RETURN_IF_ERROR(stages_.EmbedForward(*mb));
    ZR_RETURN_IF_ERROR(stages_.BlocksForward(*mb, first, last));
    if (LastChunk(a.chunk)) {
      ZR_ASSIGN_OR_RETURN(double loss, stages_.HeadForward(*mb, step.loss_scale, nullptr));
      step.loss += loss;
    }
    // Evaluation: the micro-batch is done here after its last local chunk (and its send).
    if (!step.train && a.chunk + 1 == options_.shape.virtual_stages && LastChunk(a.chunk)) {
      mb.reset();
    }
  } else {
    if (!mb) return absl::InternalError("a backward before its forward");
    if (LastChunk(a.chunk)) ZR_RETURN_IF_ERROR(stages_.HeadBackward(*mb));
    const void* dout = nullptr;
    if (!LastChunk(a.chunk)) {
      auto it = step.grad_in.find({a.micro_batch, a.chunk});
      if (it == step.grad_in.end()) return absl::InternalError("a backward before its receive");
      dout = it->second.data();
    }
    void* dx = nullptr;
    if (!FirstChunk(a.chunk)) {
      const int64_t n = stages_.BoundaryElements(*mb);
      ZR_ASSIGN_OR_RETURN(
          Buffer out, options_.allocator->Allocate(n * DTypeSize(stages_.BoundaryDType()),
                                                   MemoryCategory::kCommBuffers, options_.stream));
      dx = out.data();
      step.grad_out[{a.micro_batch, a.chunk}] = std::move(out);
    }
    ZR_RETURN_IF_ERROR(stages_.BlocksBackward(*mb, first, last, dout, dx));
    step.grad_in.erase({a.micro_batch, a.chunk});
    if (FirstChunk(a.chunk)) ZR_RETURN_IF_ERROR(stages_.EmbedBackward(*mb));
    if (a.chunk == 0) mb.reset();  // its last backward on this stage
  }
  if (options_.span) {
    ZR_RETURN_IF_ERROR(AtStreamPoint(
        *options_.stream, [span = options_.span, began,
                           what = StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk)] {
          span(what, "compute", *began, Clock::now());
        }));
  }
  return absl::OkStatus();
}

Status PipelineExecutor::Send(Step& step, const PipelineAction& a) {
  const auto t0 = std::chrono::system_clock::now();
  if (options_.stage == options_.fail_send_stage && !failed_send_) {
    failed_send_ = true;
    Logger()->warn("fault injection: stage {} {} its {} {}.{}", options_.stage,
                   options_.fail_send_dies ? "dies at" : "skips", PipelineOpName(a.op),
                   a.micro_batch, a.chunk);
    if (options_.fail_send_dies) std::_Exit(7);
    return absl::OkStatus();
  }
  const bool forward = a.op == PipelineOp::kSendForward;
  const ChunkAddress to = forward ? NextChunk(options_.shape, options_.stage, a.chunk)
                                  : PreviousChunk(options_.shape, options_.stage, a.chunk);
  const DType dtype = stages_.BoundaryDType();
  const size_t elem = DTypeSize(dtype);
  // The boundary: the micro-batch's output (a forward), or the input gradient BlocksBackward
  // wrote for this send (a backward: the micro-batch itself may be gone by now).
  auto& mb = step.mbs[a.micro_batch];
  Buffer gradient;
  if (!forward) {
    auto it = step.grad_out.find({a.micro_batch, a.chunk});
    if (it == step.grad_out.end()) return absl::InternalError("a gradient sent before computed");
    gradient = std::move(it->second);
    step.grad_out.erase(it);
  }
  const int64_t n =
      forward ? stages_.BoundaryElements(*mb) : static_cast<int64_t>(gradient.bytes() / elem);
  const auto [offset, count] = Slice(n);  // all of it, or this rank's 1/tp (scatter/gather)
  Buffer copy;                            // what the send reads until it completes
  const void* data;                       // this rank's part within it
  if (forward) {  // a copy of the part, so the micro-batch can go before the send ends
    ZR_ASSIGN_OR_RETURN(copy, options_.allocator->Allocate(
                                  count * elem, MemoryCategory::kCommBuffers, options_.stream));
    const auto* from =
        static_cast<const std::byte*>(stages_.BlockInput(*mb, options_.chunks[a.chunk].second));
    ZR_RETURN_IF_ERROR(CopyBytes(copy.data(), options_.allocator->device(), from + offset * elem,
                                 options_.allocator->device(), count * elem, options_.stream));
    data = copy.data();
    if (!step.train && a.chunk + 1 == options_.shape.virtual_stages) mb.reset();
  } else {
    copy = std::move(gradient);
    data = static_cast<const std::byte*>(copy.data()) + offset * elem;
  }
  Communicator* link = To(to.stage);
  // Kept from now on: a send issued on a link's stream may read it even if a later call fails.
  std::deque<InFlight>& copies = in_flight_[link];
  copies.push_back({.copy = std::move(copy)});
  link->recorder().SetLabel(StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk));
  const bool on_link_stream = StreamOf(link) != nullptr;
  const Status issued =
      on_link_stream
          ? SendOnLinkStream(*link, data, count, dtype, copies.back().sent)
          : link->p2p().PostSend(data, count, dtype, PipelineLinks::kReceiverRank, options_.stream);
  link->recorder().SetLabel("");
  ZR_RETURN_IF_ERROR(issued);
  bytes_sent_ += count * static_cast<int64_t>(elem);
  ZR_RETURN_IF_ERROR(ReleaseSent());
  if (options_.span && !on_link_stream) {  // on a link's stream the send is on its own track
    options_.span(
        StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk, " to stage ", to.stage),
        "p2p", t0, std::chrono::system_clock::now());
  }
  return absl::OkStatus();
}

Status PipelineExecutor::Receive(Step& step, const std::vector<PipelineAction>& batch) {
  const auto t0 = std::chrono::system_clock::now();
  const DType dtype = stages_.BoundaryDType();
  const size_t elem = DTypeSize(dtype);
  std::map<int, std::vector<P2POp>> ops;                // per stage received from (its link)
  std::map<int, std::vector<std::string>> labels;       // each receive's, in the same order
  std::vector<std::pair<std::byte*, int64_t>> gathers;  // whole buffers to all-gather into
  std::string label;                                    // the whole batch's
  for (const PipelineAction& a : batch) {
    const bool forward = a.op == PipelineOp::kRecvForward;
    const ChunkAddress from = forward ? PreviousChunk(options_.shape, options_.stage, a.chunk)
                                      : NextChunk(options_.shape, options_.stage, a.chunk);
    auto& mb = step.mbs[a.micro_batch];
    if (!mb) {
      const PipelineData& d = step.data[a.micro_batch];
      ZR_ASSIGN_OR_RETURN(mb, stages_.Begin(d.tokens, d.targets, step.batch, step.seq, step.train));
    }
    const int64_t n = stages_.BoundaryElements(*mb);
    std::byte* into = nullptr;
    if (forward) {
      into = static_cast<std::byte*>(stages_.BlockInput(*mb, options_.chunks[a.chunk].first));
    } else {
      ZR_ASSIGN_OR_RETURN(Buffer b, options_.allocator->Allocate(
                                        n * elem, MemoryCategory::kCommBuffers, options_.stream));
      into = static_cast<std::byte*>(b.data());
      step.grad_in[{a.micro_batch, a.chunk}] = std::move(b);
    }
    const auto [offset, count] = Slice(n);
    ops[from.stage].push_back({P2POp::kRecv, into + offset * elem, static_cast<size_t>(count),
                               PipelineLinks::kSenderRank});
    if (count != n) gathers.emplace_back(into, n);
    labels[from.stage].push_back(StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk));
    StrAppend(&label, label.empty() ? "" : ", ", labels[from.stage].back());
  }
  bool on_link_streams = false;
  for (const auto& [stage, recvs] : ops) {
    Communicator* link = From(stage);
    if (StreamOf(link) != nullptr) {
      on_link_streams = true;
      ZR_RETURN_IF_ERROR(ReceiveOnLinkStream(*link, recvs, labels[stage], dtype));
      continue;
    }
    link->recorder().SetLabel(label);
    const Status received = link->p2p().Exchange(recvs, dtype, options_.stream);
    link->recorder().SetLabel("");
    ZR_RETURN_IF_ERROR(received);
  }
  for (const auto& [into, n] : gathers) {
    const auto [offset, count] = Slice(n);
    options_.tp.comm->recorder().SetLabel("pipeline scatter/gather");
    const Status gathered =
        options_.tp.comm->AllGather(into + offset * elem, into, count, dtype, options_.stream);
    options_.tp.comm->recorder().SetLabel("");  // the model's own collectives follow on this group
    ZR_RETURN_IF_ERROR(gathered);
  }
  ZR_RETURN_IF_ERROR(ReleaseSent());
  if (options_.span && !on_link_streams) {
    options_.span(label, "p2p", t0, std::chrono::system_clock::now());
  }
  return absl::OkStatus();
}

StatusOr<double> PipelineExecutor::Run(const std::vector<PipelineAction>& actions,
                                       std::span<const PipelineData> data, int batch, int seq,
                                       bool train, float loss_scale) {
  auto step = std::make_unique<Step>();
  step->data = data;
  step->batch = batch;
  step->seq = seq;
  step->train = train;
  step->loss_scale = loss_scale;
  step->mbs.resize(data.size());
  Status status = RunActions(*step, actions);
  if (status.ok()) status = FinishTransfers();
  if (!status.ok() && !link_streams_.empty()) {
    abandoned_.push_back(std::move(step));  // [Note: pipeline transfers on streams of their own]
  }
  ZR_RETURN_IF_ERROR(status);
  return step->loss;
}

Status PipelineExecutor::RunActions(Step& step, const std::vector<PipelineAction>& actions) {
  for (const std::vector<PipelineAction>& b : PipelineBatches(actions)) {
    const PipelineOp op = b.front().op;
    if (op == PipelineOp::kForward || op == PipelineOp::kBackward) {
      ZR_RETURN_IF_ERROR(Compute(step, b.front()));
    } else if (op == PipelineOp::kSendForward || op == PipelineOp::kSendBackward) {
      ZR_RETURN_IF_ERROR(Send(step, b.front()));
    } else {
      ZR_RETURN_IF_ERROR(Receive(step, b));
    }
  }
  for (const auto& mb : step.mbs) {
    if (mb) return absl::InternalError("a micro-batch left unfinished by the schedule");
  }
  return absl::OkStatus();
}

StatusOr<double> PipelineExecutor::Train(std::span<const PipelineData> data, int batch, int seq,
                                         float loss_scale) {
  if (static_cast<int>(data.size()) != options_.shape.micro_batches) {
    return absl::InvalidArgumentError(
        StrCat(data.size(), " micro-batches for a schedule of ", options_.shape.micro_batches));
  }
  ZR_ASSIGN_OR_RETURN(std::vector<PipelineAction> actions,
                      PipelineActions(options_.shape, options_.stage));
  return Run(actions, data, batch, seq, true, loss_scale);
}

StatusOr<double> PipelineExecutor::Evaluate(std::span<const PipelineData> data, int batch,
                                            int seq) {
  if (data.empty()) return 0.0;
  PipelineShape shape = options_.shape;
  shape.micro_batches = static_cast<int>(data.size());
  ZR_ASSIGN_OR_RETURN(std::vector<PipelineAction> actions,
                      PipelineForwardActions(shape, options_.stage));
  return Run(actions, data, batch, seq, false, 0.0f);
}

StatusOr<std::vector<int32_t>> PipelineExecutor::Generate(std::vector<int32_t> prompt,
                                                          int new_tokens,
                                                          const SamplingOptions& sampling) {
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (new_tokens < 0) return absl::InvalidArgumentError("Generate: new_tokens is negative");
  const int seq_len = stages_.config().seq_len;
  const int p = options_.shape.stages;
  std::mt19937_64 rng(sampling.seed);
  for (int i = 0; i < new_tokens; ++i) {
    const int seq = std::min<int>(static_cast<int>(prompt.size()), seq_len);
    const std::span<const int32_t> window = std::span(prompt).last(seq);
    ZR_ASSIGN_OR_RETURN(DecoderStages::MicroBatchPtr mb, stages_.Begin(window, {}, 1, seq, false));
    int32_t token = 0;
    for (int c = 0; c < options_.shape.virtual_stages; ++c) {
      const auto [first, last] = options_.chunks[c];
      const DType dtype = stages_.BoundaryDType();
      const int64_t n = stages_.BoundaryElements(*mb);
      if (FirstChunk(c)) {
        ZR_RETURN_IF_ERROR(stages_.EmbedForward(*mb));
      } else {
        const ChunkAddress from = PreviousChunk(options_.shape, options_.stage, c);
        ZR_RETURN_IF_ERROR(From(from.stage)
                               ->p2p()
                               .Recv(stages_.BlockInput(*mb, first), n, dtype,
                                     PipelineLinks::kSenderRank, options_.stream));
      }
      ZR_RETURN_IF_ERROR(stages_.BlocksForward(*mb, first, last));
      if (LastChunk(c)) {
        std::vector<double> logits;
        ZR_RETURN_IF_ERROR(stages_.HeadForward(*mb, 0.0f, &logits, seq - 1).status());
        token = SampleToken(logits, sampling, rng);
      } else {
        const ChunkAddress to = NextChunk(options_.shape, options_.stage, c);
        ZR_RETURN_IF_ERROR(To(to.stage)->p2p().Send(stages_.BlockInput(*mb, last), n, dtype,
                                                    PipelineLinks::kReceiverRank, options_.stream));
      }
    }
    if (p > 1) {  // the last stage's token to every stage (the others add 0)
      ZR_RETURN_IF_ERROR(AllReduceHostValues(*options_.pipeline, *options_.allocator,
                                             *options_.stream, &token, 1, DType::kI32,
                                             ReduceOp::kSum));
    }
    prompt.push_back(token);
  }
  return prompt;
}

}  // namespace zerort
