// PipelineExecutor: one stage's actions over a GptModel.
#include "layers/pipeline_executor.h"

#include <cstdlib>
#include <map>
#include <numeric>
#include <random>

#include "runtime/host_collectives.h"
#include "runtime/log.h"
#include "runtime/strings.h"

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

StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(GptModel& model,
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
  return std::unique_ptr<PipelineExecutor>(
      new PipelineExecutor(model, std::move(options), std::move(links)));
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
  std::vector<GptModel::MicroBatchPtr> mbs;
  std::map<std::pair<int, int>, Buffer> grad_in;   // received gradients, per (micro-batch, chunk)
  std::map<std::pair<int, int>, Buffer> grad_out;  // computed input gradients, to send
  double loss = 0;
};

Status PipelineExecutor::ReleaseSent() {
  for (auto& [link, copies] : in_flight_) {
    while (copies.size() > link->posted_sends()) copies.pop_front();
  }
  return absl::OkStatus();
}

// [Note: pipeline transfers on the asynchronous CPU device]
// On cpu-async the compute stream is a queue on its own thread, and the communicators cannot
// post a send or a batch of receives there (an operation that completes across calls has no
// place in an in-order queue: a send waiting for its receiver would hold up everything queued
// behind it on that stream). So a transfer first waits for the compute stream, then runs on the
// host as on the synchronous device: a forward's send copy and a received boundary are then
// complete before the host goes on, and the stream-ordered buffers they live in are not in use
// by the stream. The transfers therefore do not overlap compute on cpu-async (on a GPU they do:
// the stream's NCCL operations); everything else of the stage (its ZeRO collectives, gathers and
// reductions) stays queued.
StatusOr<Stream*> PipelineExecutor::TransferStream() {
  Stream* s = options_.stream;
  if (s == nullptr || !s->device().is_cpu() || !s->asynchronous()) return s;
  ZR_RETURN_IF_ERROR(s->Synchronize());
  return nullptr;
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
  const auto t0 = std::chrono::system_clock::now();
  const auto [first, last] = options_.chunks[a.chunk];
  auto& mb = step.mbs[a.micro_batch];
  if (a.op == PipelineOp::kForward) {
    if (!mb) {
      const PipelineData& d = step.data[a.micro_batch];
      ZR_ASSIGN_OR_RETURN(mb, model_.Begin(d.tokens, d.targets, step.batch, step.seq, step.train));
    }
    if (FirstChunk(a.chunk)) ZR_RETURN_IF_ERROR(model_.EmbedForward(*mb));
    ZR_RETURN_IF_ERROR(model_.BlocksForward(*mb, first, last));
    if (LastChunk(a.chunk)) {
      ZR_ASSIGN_OR_RETURN(double loss, model_.HeadForward(*mb, step.loss_scale, nullptr));
      step.loss += loss;
    }
    // Evaluation: the micro-batch is done here after its last local chunk (and its send).
    if (!step.train && a.chunk + 1 == options_.shape.virtual_stages && LastChunk(a.chunk)) {
      mb.reset();
    }
  } else {
    if (!mb) return absl::InternalError("a backward before its forward");
    if (LastChunk(a.chunk)) ZR_RETURN_IF_ERROR(model_.HeadBackward(*mb));
    const void* dout = nullptr;
    if (!LastChunk(a.chunk)) {
      auto it = step.grad_in.find({a.micro_batch, a.chunk});
      if (it == step.grad_in.end()) return absl::InternalError("a backward before its receive");
      dout = it->second.data();
    }
    void* dx = nullptr;
    if (!FirstChunk(a.chunk)) {
      const int64_t n = model_.BoundaryElements(*mb);
      ZR_ASSIGN_OR_RETURN(
          Buffer out, options_.allocator->Allocate(n * DTypeSize(model_.BoundaryDType()),
                                                   MemoryCategory::kCommBuffers, options_.stream));
      dx = out.data();
      step.grad_out[{a.micro_batch, a.chunk}] = std::move(out);
    }
    ZR_RETURN_IF_ERROR(model_.BlocksBackward(*mb, first, last, dout, dx));
    step.grad_in.erase({a.micro_batch, a.chunk});
    if (FirstChunk(a.chunk)) ZR_RETURN_IF_ERROR(model_.EmbedBackward(*mb));
    if (a.chunk == 0) mb.reset();  // its last backward on this stage
  }
  if (options_.span) {
    options_.span(StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk), "compute", t0,
                  std::chrono::system_clock::now());
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
  const DType dtype = model_.BoundaryDType();
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
      forward ? model_.BoundaryElements(*mb) : static_cast<int64_t>(gradient.bytes() / elem);
  const auto [offset, count] = Slice(n);  // all of it, or this rank's 1/tp (scatter/gather)
  Buffer copy;                            // what the send reads until it completes
  const void* data;                       // this rank's part within it
  if (forward) {  // a copy of the part, so the micro-batch can go before the send ends
    ZR_ASSIGN_OR_RETURN(copy, options_.allocator->Allocate(
                                  count * elem, MemoryCategory::kCommBuffers, options_.stream));
    const auto* from =
        static_cast<const std::byte*>(model_.BlockInput(*mb, options_.chunks[a.chunk].second));
    ZR_RETURN_IF_ERROR(CopyBytes(copy.data(), options_.allocator->device(), from + offset * elem,
                                 options_.allocator->device(), count * elem, options_.stream));
    data = copy.data();
    if (!step.train && a.chunk + 1 == options_.shape.virtual_stages) mb.reset();
  } else {
    copy = std::move(gradient);
    data = static_cast<const std::byte*>(copy.data()) + offset * elem;
  }
  Communicator* link = To(to.stage);
  ZR_ASSIGN_OR_RETURN(Stream* const on, TransferStream());
  link->SetTraceLabel(StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk));
  const Status posted = link->PostSend(data, count, dtype, PipelineLinks::kReceiverRank, on);
  link->SetTraceLabel("");
  ZR_RETURN_IF_ERROR(posted);
  bytes_sent_ += count * static_cast<int64_t>(elem);
  in_flight_[link].push_back(std::move(copy));
  ZR_RETURN_IF_ERROR(ReleaseSent());
  if (options_.span) {
    options_.span(
        StrCat(PipelineOpName(a.op), " ", a.micro_batch, ".", a.chunk, " to stage ", to.stage),
        "p2p", t0, std::chrono::system_clock::now());
  }
  return absl::OkStatus();
}

Status PipelineExecutor::Receive(Step& step, const std::vector<PipelineAction>& batch) {
  const auto t0 = std::chrono::system_clock::now();
  const DType dtype = model_.BoundaryDType();
  const size_t elem = DTypeSize(dtype);
  std::map<int, std::vector<P2POp>> ops;                // per stage received from (its link)
  std::vector<std::pair<std::byte*, int64_t>> gathers;  // whole buffers to all-gather into
  std::string label;
  for (const PipelineAction& a : batch) {
    const bool forward = a.op == PipelineOp::kRecvForward;
    const ChunkAddress from = forward ? PreviousChunk(options_.shape, options_.stage, a.chunk)
                                      : NextChunk(options_.shape, options_.stage, a.chunk);
    auto& mb = step.mbs[a.micro_batch];
    if (!mb) {
      const PipelineData& d = step.data[a.micro_batch];
      ZR_ASSIGN_OR_RETURN(mb, model_.Begin(d.tokens, d.targets, step.batch, step.seq, step.train));
    }
    const int64_t n = model_.BoundaryElements(*mb);
    std::byte* into = nullptr;
    if (forward) {
      into = static_cast<std::byte*>(model_.BlockInput(*mb, options_.chunks[a.chunk].first));
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
    StrAppend(&label, label.empty() ? "" : ", ", PipelineOpName(a.op), " ", a.micro_batch, ".",
              a.chunk);
  }
  ZR_ASSIGN_OR_RETURN(Stream* const on, TransferStream());
  for (const auto& [stage, recvs] : ops) {
    Communicator* link = From(stage);
    link->SetTraceLabel(label);
    const Status received = link->Exchange(recvs, dtype, on);
    link->SetTraceLabel("");
    ZR_RETURN_IF_ERROR(received);
  }
  for (const auto& [into, n] : gathers) {
    const auto [offset, count] = Slice(n);
    options_.tp.comm->SetTraceLabel("pipeline scatter/gather");
    const Status gathered =
        options_.tp.comm->AllGather(into + offset * elem, into, count, dtype, options_.stream);
    options_.tp.comm->SetTraceLabel("");  // the model's own collectives follow on this group
    ZR_RETURN_IF_ERROR(gathered);
  }
  ZR_RETURN_IF_ERROR(ReleaseSent());
  if (options_.span) options_.span(label, "p2p", t0, std::chrono::system_clock::now());
  return absl::OkStatus();
}

StatusOr<double> PipelineExecutor::Run(const std::vector<PipelineAction>& actions,
                                       std::span<const PipelineData> data, int batch, int seq,
                                       bool train, float loss_scale) {
  Step step;
  step.data = data;
  step.batch = batch;
  step.seq = seq;
  step.train = train;
  step.loss_scale = loss_scale;
  step.mbs.resize(data.size());
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
  for (Communicator* link : links_.outgoing()) ZR_RETURN_IF_ERROR(link->WaitSends());
  in_flight_.clear();
  return step.loss;
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
  const int seq_len = model_.config().seq_len;
  const int p = options_.shape.stages;
  std::mt19937_64 rng(sampling.seed);
  for (int i = 0; i < new_tokens; ++i) {
    const int seq = std::min<int>(static_cast<int>(prompt.size()), seq_len);
    const std::span<const int32_t> window = std::span(prompt).last(seq);
    ZR_ASSIGN_OR_RETURN(GptModel::MicroBatchPtr mb, model_.Begin(window, {}, 1, seq, false));
    int32_t token = 0;
    for (int c = 0; c < options_.shape.virtual_stages; ++c) {
      const auto [first, last] = options_.chunks[c];
      const DType dtype = model_.BoundaryDType();
      const int64_t n = model_.BoundaryElements(*mb);
      if (FirstChunk(c)) {
        ZR_RETURN_IF_ERROR(model_.EmbedForward(*mb));
      } else {
        const ChunkAddress from = PreviousChunk(options_.shape, options_.stage, c);
        ZR_RETURN_IF_ERROR(From(from.stage)
                               ->Recv(model_.BlockInput(*mb, first), n, dtype,
                                      PipelineLinks::kSenderRank, options_.stream));
      }
      ZR_RETURN_IF_ERROR(model_.BlocksForward(*mb, first, last));
      if (LastChunk(c)) {
        std::vector<double> logits;
        ZR_RETURN_IF_ERROR(model_.HeadForward(*mb, 0.0f, &logits, seq - 1).status());
        token = SampleToken(logits, sampling, rng);
      } else {
        const ChunkAddress to = NextChunk(options_.shape, options_.stage, c);
        ZR_RETURN_IF_ERROR(To(to.stage)->Send(model_.BlockInput(*mb, last), n, dtype,
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
