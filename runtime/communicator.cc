// The shared half of every communicator: validation, tracing, error context, CUDA staging.
#include "zerort/runtime/communicator.h"

#include <condition_variable>
#include <limits>
#include <mutex>
#include <vector>

#include "zerort/runtime/internal/cpu_streams.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {
namespace {

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

Status CheckBuffer(const void* ptr, size_t count, std::string_view what) {
  if (ptr == nullptr && count > 0) {
    return absl::InvalidArgumentError(StrCat(what, " buffer is null for ", count, " elements"));
  }
  return absl::OkStatus();
}

Status CheckReduce(DType dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return absl::InvalidArgumentError(
        StrCat("reduce op avg needs a floating-point dtype, got ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "invalid";
}

struct Communicator::Call {
  CollectiveOp op;
  size_t bytes;
  DType dtype;
  int peer;
  size_t sent = 0;  // point-to-point: the bytes this rank sends ([Note: bytes on the wire])
};

namespace {

// [Note: bytes on the wire] (comm_recorder.h): a collective's ring share, a point-to-point call's
// sends.
size_t WireBytes(CollectiveOp op, size_t bytes, size_t sent, int size) {
  const bool p2p =
      op == CollectiveOp::kSend || op == CollectiveOp::kSendRecv || op == CollectiveOp::kExchange;
  return p2p ? sent : RingBytesSent(op, bytes, size);
}

}  // namespace

// [Note: one communicator, one order]
// A communicator's operations run in the order they were issued, whichever stream issued them
// or whether the host did. That is the rule of every backend: NCCL runs a communicator's kernels
// in launch order across streams, MPI forbids two threads in collectives on one communicator at
// once, and loopback ranks meet by position. On CUDA the host issues everything, so issue order
// is run order. On the asynchronous CPU device it is not: a collective queued on the compute
// stream (the gradient norm's all-reduce) and one queued earlier on the comm stream (a gather's
// broadcast) ran at once on the two streams' threads, the same MPI communicator in two threads
// (found by ThreadSanitizer under `mpirun -np 4`, ZeRO-3 with broadcast gathers). So every
// operation takes a ticket when it is issued and, where it runs, waits until every earlier
// ticket has run: a stream's thread waits as a CUDA stream waits for NCCL's previous kernel. A
// queued operation that never runs (its stream failed, so the item is skipped) still takes its
// turn when its closure is destroyed, and passes it on at once. Nothing may issue an operation
// from inside a queued item: its ticket would be later than tickets queued behind it on the same
// stream.
class Communicator::Turns {
 public:
  uint64_t Take() {
    std::lock_guard lock(mu_);
    return issued_++;
  }
  void Wait(uint64_t ticket) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return next_ == ticket; });
  }
  void Pass() {  // by the ticket whose turn it is
    {
      std::lock_guard lock(mu_);
      ++next_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t issued_ = 0;  // tickets handed out
  uint64_t next_ = 0;    // the ticket whose turn it is
};

// One operation's place in the order, taken when it is issued; passed on when destroyed (after
// its turn, waited for then if the operation never ran).
class Communicator::Ticket {
 public:
  explicit Ticket(std::shared_ptr<Turns> turns)
      : turns_(std::move(turns)), ticket_(turns_->Take()) {}
  ~Ticket() {
    turns_->Wait(ticket_);
    turns_->Pass();
  }
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;
  void Wait() const { turns_->Wait(ticket_); }

 private:
  const std::shared_ptr<Turns> turns_;
  const uint64_t ticket_;
};

Communicator::Communicator(int rank, int size, std::string backend, CommOptions options,
                           Watchdog* watchdog, std::function<void()> abort)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      recorder_(options_.name, std::move(backend), rank, size, options_.trace_capacity),
      watchdog_(watchdog),
      turns_(std::make_shared<Turns>()) {
  ZR_CHECK(size_ > 0 && rank_ >= 0 && rank_ < size_) << "rank " << rank_ << " of " << size_;
  if (watchdog_ != nullptr) watchdog_->Register(&recorder_.trace_, std::move(abort));
}

Communicator::~Communicator() {
  if (watchdog_ != nullptr) watchdog_->Unregister(&recorder_.trace_);
}

namespace {
using internal::IsQueuedCpu;
// Pipeline transfers (posted sends, exchanges) complete across calls; they do not run on a
// queued stream yet (docs/async-device.md).
Status RefuseQueued(const Stream* stream, std::string_view what) {
  if (!IsQueuedCpu(stream)) return absl::OkStatus();
  return absl::UnimplementedError(StrCat(what, " on the queued CPU stream '", stream->name(),
                                         "': not supported on the asynchronous CPU device yet"));
}
}  // namespace

std::string Communicator::Where() const {
  return StrCat("rank ", rank_, "/", size_, " in group '", options_.name, "' (", backend(), ")");
}

bool Communicator::NeedsStaging(Stream* stream) const {
  return host_buffers() && stream != nullptr && stream->device().is_cuda();
}

Status Communicator::CheckStream(Stream* stream) const {
  const bool on_device = stream != nullptr && stream->device().is_cuda();
  if (!host_buffers() && !on_device) {
    return absl::InvalidArgumentError(StrCat(
        "the ", backend(),
        " communicator moves CUDA buffers only; pass the CUDA stream the buffers belong to"));
  }
  return absl::OkStatus();
}

StatusOr<Buffer> Communicator::Staging(size_t bytes) {
  if (staging_allocator_ == nullptr) {
    ZR_ASSIGN_OR_RETURN(staging_allocator_, MakePinnedHostAllocator(options_.tracker));
  }
  return staging_allocator_->Allocate(bytes, MemoryCategory::kCommBuffers);
}

Status Communicator::Run(const Call& call, const std::function<Status(Stream*)>& body,
                         Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckStream(stream));
  recorder_.CountWire(WireBytes(call.op, call.bytes, call.sent, size_), options_.crosses_nodes);
  if (IsQueuedCpu(stream)) {
    // [Note: the asynchronous CPU device]: the collective runs on the stream's thread, in its
    // order and in its turn on this communicator (the body captures by value: this frame is gone
    // by then), traced from when it runs there, under the label it was issued with; the host goes
    // on. Loopback ranks meet on their streams' threads.
    auto ticket = std::make_shared<const Ticket>(turns_);
    return stream->Launch(
        [this, call, body, stream, ticket, issued_label = recorder_.trace_.label()] {
          ticket->Wait();
          return RunNow(call, body, nullptr, stream, &issued_label);
        });
  }
  const Ticket ticket(turns_);
  ticket.Wait();
  return RunNow(call, body, stream);
}

Status Communicator::RunNow(const Call& call, const std::function<Status(Stream*)>& body,
                            Stream* stream, Stream* ran_on, const std::string* label) {
  const auto began = recorder_.reports_spans() ? std::chrono::system_clock::now()
                                               : std::chrono::system_clock::time_point();
  const bool staged = NeedsStaging(stream);
  if (staged) {
    // Host backends read the buffers when called: the stream's work must have produced them.
    ZR_RETURN_IF_ERROR(stream->Synchronize());
  }
  const std::string labelled = label != nullptr ? *label : recorder_.trace_.label();
  const uint64_t seq = recorder_.trace_.Begin(call.op, call.bytes, call.dtype, call.peer,
                                              options_.timeout, &labelled);
  Status status = body(staged ? nullptr : stream);
  if (!status.ok()) {
    recorder_.trace_.End(seq, false);
    return Annotate(status, StrCat(Where(), ", ", CollectiveOpName(call.op), " of ", call.bytes,
                                   " bytes", labelled.empty() ? "" : StrCat(" (", labelled, ")")));
  }
  CompletionProbe probe = staged ? CompletionProbe() : MakeProbe(stream);
  if (probe) {
    recorder_.trace_.AttachProbe(seq, std::move(probe));
  } else {
    recorder_.trace_.End(seq, true);
    if (recorder_.reports_spans()) {
      const Stream* where = staged ? nullptr : (ran_on != nullptr ? ran_on : stream);
      recorder_.Report(CollectiveSpan{
          .op = call.op,
          .group = options_.name,
          .label = labelled,
          .bytes = call.bytes,
          .crosses_nodes = options_.crosses_nodes,
          .track = where != nullptr ? where->name() : std::string_view("host"),
          .critical = where == nullptr || !where->asynchronous() || where->name() == "compute",
          .begin = began,
          .end = std::chrono::system_clock::now()});
    }
  }
  return absl::OkStatus();
}

namespace {

// Copies between a CUDA buffer and its host staging copy (synchronously).
Status ToHost(void* host, const void* device_ptr, Device device, size_t bytes) {
  return CopyBytes(host, Device::Cpu(), device_ptr, device, bytes, nullptr);
}
Status ToDevice(void* device_ptr, Device device, const void* host, size_t bytes) {
  return CopyBytes(device_ptr, device, host, Device::Cpu(), bytes, nullptr);
}

}  // namespace

Status Communicator::AllGather(const void* send, void* recv, size_t count, DType dtype,
                               Stream* stream) {
  const size_t elem = DTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / elem / static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(StrCat("all_gather count ", count, " overflows"));
  }
  const size_t bytes = count * elem;
  ZR_RETURN_IF_ERROR(CheckBuffer(send, count, "all_gather send"));
  ZR_RETURN_IF_ERROR(CheckBuffer(recv, count, "all_gather recv"));
  auto* own_slot = static_cast<char*>(recv) + static_cast<size_t>(rank_) * bytes;
  if (send != own_slot && Overlaps(send, bytes, recv, bytes * size_)) {
    return absl::InvalidArgumentError(
        "all_gather buffers overlap; in place means send == recv + rank * count");
  }
  const Call call{CollectiveOp::kAllGather, bytes * size_, dtype, -1};
  if (NeedsStaging(stream)) {
    return Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, Staging(bytes * size_));
          char* host_slot = host.as<char>() + static_cast<size_t>(rank_) * bytes;
          ZR_RETURN_IF_ERROR(ToHost(host_slot, send, stream->device(), bytes));
          ZR_RETURN_IF_ERROR(DoAllGather(host_slot, host.data(), count, dtype, nullptr));
          return ToDevice(recv, stream->device(), host.data(), bytes * size_);
        },
        stream);
  }
  return Run(
      call, [=, this](Stream* s) { return DoAllGather(send, recv, count, dtype, s); }, stream);
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                   ReduceOp op, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckReduce(dtype, op));
  const size_t elem = DTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / elem / static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(StrCat("reduce_scatter count ", count, " overflows"));
  }
  const size_t bytes = count * elem;
  ZR_RETURN_IF_ERROR(CheckBuffer(send, count, "reduce_scatter send"));
  ZR_RETURN_IF_ERROR(CheckBuffer(recv, count, "reduce_scatter recv"));
  const auto* own_block = static_cast<const char*>(send) + static_cast<size_t>(rank_) * bytes;
  if (recv != own_block && Overlaps(send, bytes * size_, recv, bytes)) {
    return absl::InvalidArgumentError(
        "reduce_scatter buffers overlap; in place means recv == send + rank * count");
  }
  const Call call{CollectiveOp::kReduceScatter, bytes * size_, dtype, -1};
  if (NeedsStaging(stream)) {
    return Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, Staging(bytes * size_));
          char* host_block = host.as<char>() + static_cast<size_t>(rank_) * bytes;
          ZR_RETURN_IF_ERROR(ToHost(host.data(), send, stream->device(), bytes * size_));
          ZR_RETURN_IF_ERROR(DoReduceScatter(host.data(), host_block, count, dtype, op, nullptr));
          return ToDevice(recv, stream->device(), host_block, bytes);
        },
        stream);
  }
  return Run(
      call, [=, this](Stream* s) { return DoReduceScatter(send, recv, count, dtype, op, s); },
      stream);
}

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckReduce(dtype, op));
  const size_t elem = DTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / elem) {
    return absl::InvalidArgumentError(StrCat("all_reduce count ", count, " overflows"));
  }
  const size_t bytes = count * elem;
  ZR_RETURN_IF_ERROR(CheckBuffer(send, count, "all_reduce send"));
  ZR_RETURN_IF_ERROR(CheckBuffer(recv, count, "all_reduce recv"));
  if (send != recv && Overlaps(send, bytes, recv, bytes)) {
    return absl::InvalidArgumentError("all_reduce buffers overlap; in place means send == recv");
  }
  const Call call{CollectiveOp::kAllReduce, bytes, dtype, -1};
  if (NeedsStaging(stream)) {
    return Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, Staging(bytes));
          ZR_RETURN_IF_ERROR(ToHost(host.data(), send, stream->device(), bytes));
          ZR_RETURN_IF_ERROR(DoAllReduce(host.data(), host.data(), count, dtype, op, nullptr));
          return ToDevice(recv, stream->device(), host.data(), bytes);
        },
        stream);
  }
  return Run(
      call, [=, this](Stream* s) { return DoAllReduce(send, recv, count, dtype, op, s); }, stream);
}

Status Communicator::Broadcast(void* buffer, size_t count, DType dtype, int root, Stream* stream) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(StrCat("broadcast root ", root, " is not a rank of ",
                                             "group '", options_.name, "' (size ", size_, ")"));
  }
  ZR_RETURN_IF_ERROR(CheckBuffer(buffer, count, "broadcast"));
  const size_t bytes = count * DTypeSize(dtype);
  const Call call{CollectiveOp::kBroadcast, bytes, dtype, root};
  if (NeedsStaging(stream)) {
    return Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, Staging(bytes));
          if (rank_ == root)
            ZR_RETURN_IF_ERROR(ToHost(host.data(), buffer, stream->device(), bytes));
          ZR_RETURN_IF_ERROR(DoBroadcast(host.data(), count, dtype, root, nullptr));
          return rank_ == root ? absl::OkStatus()
                               : ToDevice(buffer, stream->device(), host.data(), bytes);
        },
        stream);
  }
  return Run(
      call, [=, this](Stream* s) { return DoBroadcast(buffer, count, dtype, root, s); }, stream);
}

namespace {

Status CheckPeer(int peer, int rank, int size, std::string_view what, bool allow_self) {
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(
        StrCat(what, " peer ", peer, " is not a rank of a ", "group of size ", size));
  }
  if (!allow_self && peer == rank) {
    return absl::InvalidArgumentError(
        StrCat(what, " to itself (rank ", rank, "); use SendRecv or a copy"));
  }
  return absl::OkStatus();
}

}  // namespace

Status PointToPoint::Send(const void* buffer, size_t count, DType dtype, int peer, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckPeer(peer, comm_.rank_, comm_.size_, "send", false));
  ZR_RETURN_IF_ERROR(CheckBuffer(buffer, count, "send"));
  const size_t bytes = count * DTypeSize(dtype);
  const Communicator::Call call{CollectiveOp::kSend, bytes, dtype, peer, bytes};
  if (comm_.NeedsStaging(stream)) {
    return comm_.Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, comm_.Staging(bytes));
          ZR_RETURN_IF_ERROR(ToHost(host.data(), buffer, stream->device(), bytes));
          return comm_.DoSend(host.data(), count, dtype, peer, nullptr);
        },
        stream);
  }
  return comm_.Run(
      call, [=, this](Stream* s) { return comm_.DoSend(buffer, count, dtype, peer, s); }, stream);
}

Status PointToPoint::Recv(void* buffer, size_t count, DType dtype, int peer, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckPeer(peer, comm_.rank_, comm_.size_, "recv", false));
  ZR_RETURN_IF_ERROR(CheckBuffer(buffer, count, "recv"));
  const size_t bytes = count * DTypeSize(dtype);
  const Communicator::Call call{CollectiveOp::kRecv, bytes, dtype, peer};
  if (comm_.NeedsStaging(stream)) {
    return comm_.Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, comm_.Staging(bytes));
          ZR_RETURN_IF_ERROR(comm_.DoRecv(host.data(), count, dtype, peer, nullptr));
          return ToDevice(buffer, stream->device(), host.data(), bytes);
        },
        stream);
  }
  return comm_.Run(
      call, [=, this](Stream* s) { return comm_.DoRecv(buffer, count, dtype, peer, s); }, stream);
}

Status PointToPoint::SendRecv(const void* send, size_t send_count, int dst, void* recv,
                              size_t recv_count, int src, DType dtype, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckPeer(dst, comm_.rank_, comm_.size_, "send_recv destination", true));
  ZR_RETURN_IF_ERROR(CheckPeer(src, comm_.rank_, comm_.size_, "send_recv source", true));
  ZR_RETURN_IF_ERROR(CheckBuffer(send, send_count, "send_recv send"));
  ZR_RETURN_IF_ERROR(CheckBuffer(recv, recv_count, "send_recv recv"));
  const size_t elem = DTypeSize(dtype);
  if (Overlaps(send, send_count * elem, recv, recv_count * elem)) {
    return absl::InvalidArgumentError("send_recv buffers overlap");
  }
  const Communicator::Call call{CollectiveOp::kSendRecv, (send_count + recv_count) * elem, dtype,
                                dst, send_count * elem};
  if (comm_.NeedsStaging(stream)) {
    return comm_.Run(
        call,
        [&](Stream*) -> Status {
          ZR_ASSIGN_OR_RETURN(Buffer host, comm_.Staging((send_count + recv_count) * elem));
          char* host_recv = host.as<char>() + send_count * elem;
          ZR_RETURN_IF_ERROR(ToHost(host.data(), send, stream->device(), send_count * elem));
          ZR_RETURN_IF_ERROR(comm_.DoSendRecv(host.data(), send_count, dst, host_recv, recv_count,
                                              src, dtype, nullptr));
          return ToDevice(recv, stream->device(), host_recv, recv_count * elem);
        },
        stream);
  }
  return comm_.Run(
      call,
      [=, this](Stream* s) {
        return comm_.DoSendRecv(send, send_count, dst, recv, recv_count, src, dtype, s);
      },
      stream);
}

Status PointToPoint::Exchange(std::span<const P2POp> ops, DType dtype, Stream* stream) {
  ZR_RETURN_IF_ERROR(RefuseQueued(stream, "exchange"));
  const size_t elem = DTypeSize(dtype);
  size_t bytes = 0, sent = 0;
  int peer = ops.empty() ? -1 : ops[0].peer;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::kSend;
    ZR_RETURN_IF_ERROR(CheckPeer(op.peer, comm_.rank_, comm_.size_,
                                 send ? "exchange send" : "exchange recv", false));
    ZR_RETURN_IF_ERROR(CheckBuffer(op.buffer, op.count, send ? "exchange send" : "exchange recv"));
    if (op.count > (std::numeric_limits<size_t>::max() - bytes) / elem) {
      return absl::InvalidArgumentError("exchange: the batch's bytes overflow");
    }
    bytes += op.count * elem;
    if (send) sent += op.count * elem;
    if (op.peer != peer) peer = -1;
    if (send) continue;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (j != i && Overlaps(op.buffer, op.count * elem, ops[j].buffer, ops[j].count * elem)) {
        return absl::InvalidArgumentError(
            StrCat("exchange: receive ", i, " overlaps operation ", j, " of the batch"));
      }
    }
  }
  if (ops.empty()) return absl::OkStatus();
  const Communicator::Call call{CollectiveOp::kExchange, bytes, dtype, peer, sent};
  if (comm_.NeedsStaging(stream)) {
    return comm_.Run(
        call,
        [&](Stream*) -> Status {
          // One host buffer for the whole batch: sends copied in, receives copied out after.
          ZR_ASSIGN_OR_RETURN(Buffer host, comm_.Staging(bytes));
          std::vector<P2POp> staged(ops.begin(), ops.end());
          size_t offset = 0;
          for (P2POp& op : staged) {
            void* h = host.as<char>() + offset;
            if (op.kind == P2POp::kSend) {
              ZR_RETURN_IF_ERROR(ToHost(h, op.buffer, stream->device(), op.count * elem));
            }
            op.buffer = h;
            offset += op.count * elem;
          }
          ZR_RETURN_IF_ERROR(comm_.DoExchange(staged, dtype, nullptr));
          for (size_t i = 0; i < ops.size(); ++i) {
            if (ops[i].kind != P2POp::kRecv) continue;
            ZR_RETURN_IF_ERROR(
                ToDevice(ops[i].buffer, stream->device(), staged[i].buffer, ops[i].count * elem));
          }
          return absl::OkStatus();
        },
        stream);
  }
  ZR_RETURN_IF_ERROR(comm_.Run(
      call, [&](Stream* s) { return comm_.DoExchange(ops, dtype, s); }, stream));
  return PollSends();
}

Status PointToPoint::PostSend(const void* buffer, size_t count, DType dtype, int peer,
                              Stream* stream) {
  ZR_RETURN_IF_ERROR(RefuseQueued(stream, "posted send"));
  ZR_RETURN_IF_ERROR(CheckPeer(peer, comm_.rank_, comm_.size_, "posted send", false));
  ZR_RETURN_IF_ERROR(CheckBuffer(buffer, count, "posted send"));
  ZR_RETURN_IF_ERROR(comm_.CheckStream(stream));
  const size_t bytes = count * DTypeSize(dtype);
  auto fail = [&](const Status& status) {
    return Annotate(status, StrCat(comm_.Where(), ", posted send of ", bytes, " bytes to ", peer));
  };
  PostedSend posted{};
  const void* from = buffer;
  Stream* on = stream;
  if (comm_.NeedsStaging(stream)) {
    ZR_RETURN_IF_ERROR(stream->Synchronize());
    ZR_ASSIGN_OR_RETURN(posted.staging, comm_.Staging(bytes));
    ZR_RETURN_IF_ERROR(ToHost(posted.staging.data(), buffer, stream->device(), bytes));
    from = posted.staging.data();
    on = nullptr;
  } else if (stream != nullptr && stream->device().is_cpu()) {
    on = nullptr;
  }
  const Communicator::Ticket ticket(comm_.turns_);
  ticket.Wait();
  comm_.recorder_.CountWire(bytes, comm_.options_.crosses_nodes);
  posted.seq =
      comm_.recorder_.trace_.Begin(CollectiveOp::kSend, bytes, dtype, peer, comm_.options_.timeout);
  if (Status status = comm_.DoPostSend(from, count, dtype, peer, on); !status.ok()) {
    comm_.recorder_.trace_.End(posted.seq, false);
    return fail(status);
  }
  posted_.push_back(std::move(posted));
  return PollSends();
}

Status PointToPoint::PollSends() {
  if (posted_.empty()) return absl::OkStatus();
  ZR_ASSIGN_OR_RETURN(size_t done, comm_.DoPollSends());
  for (; done > 0 && !posted_.empty(); --done) {
    comm_.recorder_.trace_.End(posted_.front().seq, true);
    posted_.pop_front();
  }
  return absl::OkStatus();
}

Status PointToPoint::WaitSends() {
  if (posted_.empty()) return absl::OkStatus();
  Status status = comm_.DoWaitSends();
  for (const PostedSend& p : posted_) comm_.recorder_.trace_.End(p.seq, status.ok());
  posted_.clear();
  if (!status.ok()) {
    return Annotate(status, StrCat(comm_.Where(), ", waiting for posted sends"));
  }
  return absl::OkStatus();
}

Status Communicator::Barrier() {
  const Call call{CollectiveOp::kBarrier, 0, DType::kU8, -1};
  const Ticket ticket(turns_);
  ticket.Wait();
  const uint64_t seq = recorder_.trace_.Begin(call.op, 0, call.dtype, -1, options_.timeout);
  Status status = DoBarrier();
  recorder_.trace_.End(seq, status.ok());
  if (!status.ok()) {
    return Annotate(status, StrCat(Where(), ", barrier"));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key,
                                                            CommOptions options) {
  if (color < kNoColor) {
    return absl::InvalidArgumentError(
        StrCat("split colour ", color, " is negative (use kNoColor to opt out)"));
  }
  const Ticket ticket(turns_);
  ticket.Wait();
  const uint64_t seq =
      recorder_.trace_.Begin(CollectiveOp::kSplit, 0, DType::kI32, color, options_.timeout);
  StatusOr<std::unique_ptr<Communicator>> result = DoSplit(color, key, std::move(options));
  recorder_.trace_.End(seq, result.ok());
  if (result.ok() && *result != nullptr) {
    recorder_.PassOn((*result)->recorder_);
  }
  if (!result.ok()) {
    return Annotate(result.status(), StrCat(Where(), ", split"));
  }
  return result;
}

}  // namespace zerort
