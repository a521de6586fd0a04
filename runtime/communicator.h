// Communicator: the narrow interface every collective goes through, and the base that all
// backends share. The base validates arguments once for every backend (counts, ranks, buffer
// overlap, reduce-op/dtype pairs), records each collective (its CommRecorder: the trace the
// watchdog reads, spans, bytes by link), annotates errors with rank and group, and stages CUDA
// buffers through pinned host memory for backends that only move host memory (loopback, MPI).
//
// Buffer conventions (count is always in elements of `dtype`):
//   AllGather:     send has `count`, recv has size*count; rank r's send lands at recv[r*count].
//                  In place when send == recv + rank*count.
//   ReduceScatter: send has size*count, recv has `count`: block `rank` of the reduction.
//                  In place when recv == send + rank*count.
//   AllReduce:     send and recv have `count`; in place when send == recv.
//   kAvg divides the sum by the group size (floating-point dtypes only); bf16/f16 reduce in
//   fp32 and round once where the backend allows it (loopback, MPI).
// Work runs on `stream`: nullptr or a CPU stream means host buffers, a CUDA stream means device
// buffers of that stream's device. Host backends complete before returning; NCCL enqueues on the
// stream and returns.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/comm_recorder.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/memory.h"
#include "zerort/runtime/status.h"

namespace zerort {

class Watchdog;

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
std::string_view ReduceOpName(ReduceOp op);

struct CommOptions {
  std::string name = "world";                  // group name in logs and traces
  std::chrono::milliseconds timeout{600'000};  // per collective; the watchdog enforces it
  size_t trace_capacity = 64;                  // records kept for the hang report
  MemoryTracker* tracker = nullptr;            // accounts staging buffers (comm_buffers)
  // Its ranks are on more than one node ([Note: nodes], runtime/topology.h): its bytes count as
  // inter-node. Set by whoever knows the members' nodes (Session for the world, DeviceMesh for
  // its groups); a group split with a copy of its parent's options inherits the parent's.
  bool crosses_nodes = false;
};

// One send or receive of a batch (PointToPoint::Exchange).
struct P2POp {
  enum Kind : uint8_t { kSend, kRecv };
  Kind kind = kSend;
  void* buffer = nullptr;  // read by a send, written by a receive
  size_t count = 0;        // elements of the batch's dtype
  int peer = 0;
};

// Colour for Split that leaves the caller out of every new group.
inline constexpr int kNoColor = -1;

class Communicator;

// The point-to-point half of a communicator (pipeline stages' activations and gradients, ring
// exchanges): Communicator::p2p(). It shares its communicator's checks, staging, trace and turns
// ([Note: one communicator, one order]); what it owns itself is the sends posted and not yet
// reported complete.
class PointToPoint {
 public:
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // Send may complete before the matching Recv is posted (it does on loopback), or may wait for
  // it (MPI, large messages): exchanges in a ring use SendRecv.
  Status Send(const void* buffer, size_t count, DType dtype, int peer, Stream* stream = nullptr);
  Status Recv(void* buffer, size_t count, DType dtype, int peer, Stream* stream = nullptr);
  Status SendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                  int src, DType dtype, Stream* stream = nullptr);
  // A batch of point-to-point operations (pipeline stages' activations and gradients, as
  // Megatron's batch_isend_irecv): every one is posted non-blocking, then the call returns when
  // all have completed, under one trace record and so under the watchdog's deadline. Operations
  // to or from one peer match the peer's in the order listed; receive buffers must not overlap
  // any other buffer of the batch. MPI: Isend/Irecv and Waitall; NCCL: one group; loopback:
  // the sends are buffered, then the receives wait.
  Status Exchange(std::span<const P2POp> ops, DType dtype, Stream* stream = nullptr);
  // A send posted without waiting for it: it completes in the background once the peer posts
  // its receive (MPI Isend, loopback buffered, NCCL on a stream per peer), so a stage waits only
  // at its receives (a pipeline's sends). `buffer` must stay unchanged until WaitSends. Its
  // trace record stays open until the backend reports it complete (polled at every PostSend,
  // Exchange and WaitSends): a send nobody receives meets the watchdog's deadline.
  Status PostSend(const void* buffer, size_t count, DType dtype, int peer,
                  Stream* stream = nullptr);
  // Waits for every posted send.
  Status WaitSends();
  size_t posted_sends() const { return posted_.size(); }

 private:
  friend class Communicator;
  explicit PointToPoint(Communicator& comm) : comm_(comm) {}
  Status PollSends();

  Communicator& comm_;
  struct PostedSend {
    uint64_t seq;    // its trace record
    Buffer staging;  // the host copy of a CUDA buffer (host backends)
  };
  std::deque<PostedSend> posted_;  // oldest first
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  const CommOptions& options() const { return options_; }
  virtual std::string_view backend() const = 0;
  // How the backend carries out `op`, for benchmark tables.
  virtual std::string algorithm(CollectiveOp op) const = 0;

  Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                   Stream* stream = nullptr);
  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                       Stream* stream = nullptr);
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                   Stream* stream = nullptr);
  Status Broadcast(void* buffer, size_t count, DType dtype, int root, Stream* stream = nullptr);
  // Sends, receives, batches and posted sends: the point-to-point half, validated, staged and
  // traced by this communicator.
  PointToPoint& p2p() { return p2p_; }
  Status Barrier();
  // Collective over this group: callers with the same colour form a new group, ordered by
  // (key, rank). kNoColor gives nullptr.
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key, CommOptions options);

  // True when the backend moves host memory (MPI, loopback): host buffers go to it with a null
  // stream; false when it moves device memory only (NCCL), so host values are staged through the
  // device (AllReduceHostValues).
  bool moves_host_memory() const { return host_buffers(); }

  // The world's options().crosses_nodes, once the topology is known (Session); before any group
  // is split from it.
  void SetCrossesNodes(bool crosses) { options_.crosses_nodes = crosses; }

  // Its trace (and the label of the next records), spans and bytes by link.
  CommRecorder& recorder() { return recorder_; }
  const CommRecorder& recorder() const { return recorder_; }

 protected:
  Communicator(int rank, int size, std::string backend, CommOptions options, Watchdog* watchdog,
               std::function<void()> abort = {});

  // True when the backend moves host memory only; CUDA buffers are then staged.
  virtual bool host_buffers() const = 0;

  // Backend operations on arguments the base has validated (and staged to the host for host
  // backends).
  virtual Status DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                             Stream* stream) = 0;
  virtual Status DoReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                 ReduceOp op, Stream* stream) = 0;
  virtual Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                             Stream* stream) = 0;
  virtual Status DoBroadcast(void* buffer, size_t count, DType dtype, int root, Stream* stream) = 0;
  virtual Status DoSend(const void* buffer, size_t count, DType dtype, int peer,
                        Stream* stream) = 0;
  virtual Status DoRecv(void* buffer, size_t count, DType dtype, int peer, Stream* stream) = 0;
  virtual Status DoSendRecv(const void* send, size_t send_count, int dst, void* recv,
                            size_t recv_count, int src, DType dtype, Stream* stream) = 0;
  virtual Status DoExchange(std::span<const P2POp> ops, DType dtype, Stream* stream) = 0;
  virtual Status DoPostSend(const void* buffer, size_t count, DType dtype, int peer,
                            Stream* stream) = 0;
  // How many of the oldest posted sends have completed, in posting order, without waiting.
  virtual StatusOr<size_t> DoPollSends() = 0;
  virtual Status DoWaitSends() = 0;  // every posted send
  virtual Status DoBarrier() = 0;
  virtual StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key,
                                                          CommOptions options) = 0;
  // For stream backends: how the watchdog learns that the work just issued on `stream` ended.
  virtual CompletionProbe MakeProbe(Stream* stream) { return {}; }

  Watchdog* watchdog() const { return watchdog_; }

 private:
  friend class PointToPoint;
  struct Call;
  class Turns;
  class Ticket;
  // Runs `body` in its turn ([Note: one communicator, one order]): on a queued CPU stream's
  // thread when `stream` is one, else now.
  Status Run(const Call& call, const std::function<Status(Stream*)>& body, Stream* stream);
  // Runs `body` under the trace, with the stream it should use (nullptr once staged to host).
  // `ran_on`: the queued stream whose thread runs it and `label` the trace label when it was
  // issued (both set when it runs there: the host may have relabelled since).
  Status RunNow(const Call& call, const std::function<Status(Stream*)>& body, Stream* stream,
                Stream* ran_on = nullptr, const std::string* label = nullptr);
  Status CheckStream(Stream* stream) const;
  // "rank r/w in group 'g' (backend)": how every error of this communicator begins.
  std::string Where() const;
  bool NeedsStaging(Stream* stream) const;
  StatusOr<Buffer> Staging(size_t bytes);

  const int rank_;
  const int size_;
  CommOptions options_;
  CommRecorder recorder_;
  Watchdog* const watchdog_;
  std::unique_ptr<Allocator> staging_allocator_;
  const std::shared_ptr<Turns> turns_;  // shared with queued tickets
  PointToPoint p2p_{*this};  // after the staging allocator: its posted sends hold staging buffers
};

}  // namespace zerort
