// CollectiveTrace: a bounded ring of records with probe polling.
#include "zerort/runtime/collective_trace.h"
#include "zerort/runtime/strings.h"

namespace zerort {

size_t RingBytesSent(CollectiveOp op, size_t bytes, int ranks) {
  if (ranks <= 1) return 0;
  const size_t n = static_cast<size_t>(ranks);
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kBroadcast:
      return bytes * (n - 1) / n;
    case CollectiveOp::kAllReduce:
      return 2 * bytes * (n - 1) / n;
    default:
      return 0;
  }
}

double RingFactor(CollectiveOp op, int ranks) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  switch (op) {
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kBroadcast:
      return (n - 1) / n;
    case CollectiveOp::kAllReduce:
      return 2 * (n - 1) / n;
    default:
      return 0;
  }
}

std::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kSend:
      return "send";
    case CollectiveOp::kRecv:
      return "recv";
    case CollectiveOp::kSendRecv:
      return "send_recv";
    case CollectiveOp::kExchange:
      return "exchange";
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kSplit:
      return "split";
  }
  return "invalid";
}

std::string_view CollectiveStateName(CollectiveState state) {
  switch (state) {
    case CollectiveState::kIssued:
      return "in-flight";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
    case CollectiveState::kTimedOut:
      return "TIMED-OUT";
  }
  return "invalid";
}

CollectiveTrace::CollectiveTrace(std::string group, std::string backend, int rank, int size,
                                 size_t capacity)
    : group_(std::move(group)),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      capacity_(std::max<size_t>(capacity, 1)) {}

uint64_t CollectiveTrace::Begin(CollectiveOp op, size_t bytes, DType dtype, int peer,
                                Clock::duration timeout, const std::string* label) {
  std::lock_guard lock(mu_);
  CollectiveRecord record;
  record.seq = next_seq_++;
  record.op = op;
  record.bytes = bytes;
  record.dtype = dtype;
  record.peer = peer;
  record.label = label != nullptr ? *label : label_;
  record.issued = Clock::now();
  record.deadline = record.issued + timeout;
  // Drop the oldest finished records first; an in-flight one is kept until it ends.
  while (records_.size() >= capacity_ && records_.front().state != CollectiveState::kIssued) {
    records_.pop_front();
  }
  records_.push_back(std::move(record));
  return records_.back().seq;
}

CollectiveRecord* CollectiveTrace::Find(uint64_t seq) {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->seq == seq) return &*it;
  }
  return nullptr;
}

void CollectiveTrace::End(uint64_t seq, bool ok) {
  std::lock_guard lock(mu_);
  if (CollectiveRecord* record = Find(seq); record != nullptr) {
    if (record->state == CollectiveState::kIssued) {
      record->state = ok ? CollectiveState::kCompleted : CollectiveState::kFailed;
    }
    record->finished = Clock::now();
  }
}

void CollectiveTrace::AttachProbe(uint64_t seq, CompletionProbe probe) {
  std::lock_guard lock(mu_);
  probes_.emplace_back(seq, std::move(probe));
}

void CollectiveTrace::SetLabel(std::string label) {
  std::lock_guard lock(mu_);
  label_ = std::move(label);
}

std::string CollectiveTrace::label() const {
  std::lock_guard lock(mu_);
  return label_;
}

std::optional<CollectiveRecord> CollectiveTrace::PollOverdue(Clock::time_point now) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < probes_.size();) {
    StatusOr<bool> done = probes_[i].second();
    CollectiveRecord* record = Find(probes_[i].first);
    if (done.ok() && !*done) {
      ++i;
      continue;
    }
    if (record != nullptr) {
      record->state = done.ok() ? CollectiveState::kCompleted : CollectiveState::kFailed;
      record->finished = now;
      if (!done.ok()) record->label = StrCat(record->label, " [", done.status().message(), "]");
    }
    probes_.erase(probes_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!done.ok() && record != nullptr) return *record;
  }
  for (CollectiveRecord& record : records_) {
    if (record.state == CollectiveState::kIssued && now > record.deadline) {
      record.state = CollectiveState::kTimedOut;
      return record;
    }
  }
  return std::nullopt;
}

std::vector<CollectiveRecord> CollectiveTrace::Records() const {
  std::lock_guard lock(mu_);
  return {records_.begin(), records_.end()};
}

std::string CollectiveTrace::Dump() const {
  const std::vector<CollectiveRecord> records = Records();
  const Clock::time_point now = Clock::now();
  std::string out =
      fmt::sprintf("last %d collectives of rank %d/%d in group '%s' (%s):", records.size(), rank_,
                   size_, group_, backend_);
  for (const CollectiveRecord& r : records) {
    const auto end = r.state == CollectiveState::kIssued || r.state == CollectiveState::kTimedOut
                         ? now
                         : r.finished;
    const double ms = std::chrono::duration<double, std::milli>(end - r.issued).count();
    out += fmt::sprintf("\n  seq %d %-14s %12d bytes %-4s peer %-3d %-10s %10.3f ms%s%s", r.seq,
                        CollectiveOpName(r.op), r.bytes, DTypeName(r.dtype), r.peer,
                        CollectiveStateName(r.state), ms, r.label.empty() ? "" : "  ", r.label);
  }
  return out;
}

}  // namespace zerort
