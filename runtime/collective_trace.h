// The record of a communicator's last collectives, kept for the watchdog: sequence number,
// operation, bytes, dtype, peer/root, the caller's label (the unit being gathered, say), state
// and times. Host backends end a record when their call returns; a stream backend (NCCL)
// attaches a probe that the watchdog polls until the device work has finished.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort {

enum class CollectiveOp : uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kSend,
  kRecv,
  kSendRecv,
  kExchange,  // a batch of sends and receives, posted together and completed together
  kBarrier,
  kSplit,
};
std::string_view CollectiveOpName(CollectiveOp op);
// What one of `ranks` ranks sends for a collective whose buffer is `bytes` (an all-gather's or
// reduce-scatter's whole buffer, an all-reduce's or broadcast's) under ring algorithms: (n-1)/n of
// it for all-gather, reduce-scatter and broadcast, 2 (n-1)/n for all-reduce (nccl-tests' bus
// factor; [Note: bytes on the wire], comm_recorder.h). 0 for one rank and for point-to-point
// operations, whose sends only the caller knows.
size_t RingBytesSent(CollectiveOp op, size_t bytes, int ranks);
double RingFactor(CollectiveOp op, int ranks);  // the same as a fraction of `bytes`

enum class CollectiveState : uint8_t { kIssued, kCompleted, kFailed, kTimedOut };
std::string_view CollectiveStateName(CollectiveState state);

using Clock = std::chrono::steady_clock;

struct CollectiveRecord {
  uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::kBarrier;
  size_t bytes = 0;
  DType dtype = DType::kU8;
  int peer = -1;  // root of a broadcast, peer of a send/recv, -1 otherwise
  std::string label;
  CollectiveState state = CollectiveState::kIssued;
  Clock::time_point issued;
  Clock::time_point finished;
  Clock::time_point deadline;
};

// Polled by the watchdog: true when the work has finished, an error when it failed.
using CompletionProbe = std::function<StatusOr<bool>()>;

class CollectiveTrace {
 public:
  // `group` names the communicator ("world", "dp", ...), `rank`/`size` are within it.
  CollectiveTrace(std::string group, std::string backend, int rank, int size, size_t capacity);

  // The record's label is the current one (SetLabel), or `label` when given: a collective issued
  // on a queued CPU stream begins later on the stream's thread, labelled as the caller was.
  uint64_t Begin(CollectiveOp op, size_t bytes, DType dtype, int peer, Clock::duration timeout,
                 const std::string* label = nullptr);
  void End(uint64_t seq, bool ok);
  void AttachProbe(uint64_t seq, CompletionProbe probe);
  void SetLabel(std::string label);
  std::string label() const;  // the current one

  // Polls attached probes, then returns the oldest in-flight record past its deadline, marking
  // it timed out; a probe that reports an error marks its record failed and returns it too.
  std::optional<CollectiveRecord> PollOverdue(Clock::time_point now);

  std::vector<CollectiveRecord> Records() const;  // oldest first
  // "last collectives of rank r/w in group G (backend):" followed by one line per record.
  std::string Dump() const;

  const std::string& group() const { return group_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  CollectiveRecord* Find(uint64_t seq);

  const std::string group_;
  const std::string backend_;
  const int rank_;
  const int size_;
  const size_t capacity_;
  mutable std::mutex mu_;
  uint64_t next_seq_ = 1;
  std::string label_;
  std::deque<CollectiveRecord> records_;
  std::vector<std::pair<uint64_t, CompletionProbe>> probes_;
};

}  // namespace zerort
