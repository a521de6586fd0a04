// The loopback backend: threads of one process rendezvous on a shared LoopbackGroup.
#include "zerort/runtime/loopback_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "zerort/runtime/internal/host_reduce.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// memcpy with a null pointer is undefined even for zero bytes, and empty messages carry null
// pointers: every copy of this backend goes through here.
void CopyHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

// What one rank brought to a rendezvous; all ranks must bring the same kind of call.
struct Slot {
  CollectiveOp op = CollectiveOp::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  int root = -1;
  int color = 0;
  int key = 0;
};

std::string Describe(const Slot& s) {
  std::string out = StrCat(CollectiveOpName(s.op), "(count=", s.count, ", ", DTypeName(s.dtype));
  if (s.op == CollectiveOp::kAllReduce || s.op == CollectiveOp::kReduceScatter) {
    StrAppend(&out, ", ", ReduceOpName(s.reduce));
  }
  if (s.op == CollectiveOp::kBroadcast) StrAppend(&out, ", root=", s.root);
  return out + ")";
}

bool SameCall(const Slot& a, const Slot& b) {
  if (a.op != b.op) return false;
  if (a.op == CollectiveOp::kSplit || a.op == CollectiveOp::kBarrier) return true;
  return a.count == b.count && a.dtype == b.dtype && a.reduce == b.reduce && a.root == b.root;
}

struct Message {
  std::vector<std::byte> data;
  size_t count;
  DType dtype;
  std::shared_ptr<bool> taken;  // set by the receiver (under the group's lock)
};

class LoopbackGroup;

struct SplitResult {
  std::shared_ptr<LoopbackGroup> group;
  int rank = -1;
};

class LoopbackGroup {
 public:
  LoopbackGroup(int size, LoopbackSends sends)
      : size_(size), sends_(sends), slots_(size), split_results_(size) {}

  int size() const { return size_; }
  LoopbackSends sends() const { return sends_; }

  // Waits until every rank has arrived; `on_last` runs in the last arriving thread, under the
  // lock, before the others are released. When the ranks publish slots, the last arriver also
  // checks that all made the same call, and every rank returns that verdict: it is computed
  // under the lock because a rank released first may publish its next slot at once.
  Status Arrive(int rank, const Slot* slot, Clock::time_point deadline,
                const std::function<void()>& on_last = {}) {
    std::unique_lock lock(mu_);
    if (broken_) return Broken();
    if (slot != nullptr) slots_[rank] = *slot;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      verdict_ = slot != nullptr ? CheckSameCall() : absl::OkStatus();
      if (on_last && verdict_.ok()) on_last();
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return verdict_;
    }
    while (generation_ == generation) {
      if (broken_) {  // a peer waiting in this same rendezvous reached the deadline first
        return absl::DeadlineExceededError(
            StrCat("loopback rank ", rank, ": the collective timed out on another rank"));
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation) {
        broken_ = true;
        cv_.notify_all();
        return absl::DeadlineExceededError(StrCat("loopback rank ", rank, ": ", size_ - arrived_,
                                                  " of ", size_,
                                                  " ranks did not reach the collective in time"));
      }
    }
    // Stable: the next rendezvous cannot complete, and so rewrite it, until this rank arrives.
    return verdict_;
  }

  const Slot& slot(int rank) const { return slots_[rank]; }
  std::vector<std::byte>& scratch() { return scratch_; }
  std::vector<SplitResult>& split_results() { return split_results_; }

  // Returns the flag the receiver sets when it takes the message.
  std::shared_ptr<bool> Post(int src, int dst, Message message) {
    std::lock_guard lock(mu_);
    message.taken = std::make_shared<bool>(false);
    std::shared_ptr<bool> taken = message.taken;
    mailboxes_[{src, dst}].push_back(std::move(message));
    cv_.notify_all();
    return taken;
  }

  // Waits until every flag is set: the sends were received (kRendezvous).
  Status WaitTaken(int rank, const std::deque<std::pair<int, std::shared_ptr<bool>>>& sends,
                   Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    for (const auto& [peer, taken] : sends) {
      while (!*taken) {
        if (broken_) return Broken();
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !*taken) {
          return absl::DeadlineExceededError(StrCat(
              "loopback rank ", rank, ": a send to rank ", peer,
              " was not received in time, and with NCCL-like sends (LoopbackSends::kRendezvous) "
              "this communicator's later operations wait for it, as NCCL runs a "
              "communicator's operations in order"));
        }
      }
    }
    return absl::OkStatus();
  }

  // How many of the oldest `sends` were received.
  size_t CountTaken(const std::deque<std::pair<int, std::shared_ptr<bool>>>& sends) {
    std::lock_guard lock(mu_);
    size_t n = 0;
    while (n < sends.size() && *sends[n].second) ++n;
    return n;
  }

  StatusOr<Message> Take(int src, int dst, Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    auto& box = mailboxes_[{src, dst}];
    while (box.empty()) {
      if (broken_) return Broken();
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && box.empty()) {
        return absl::DeadlineExceededError(
            StrCat("loopback rank ", dst, ": no message from rank ", src, " in time"));
      }
    }
    Message message = std::move(box.front());
    box.erase(box.begin());
    *message.taken = true;
    cv_.notify_all();
    return message;
  }

 private:
  // Whether every rank made the same call as rank 0 (called under the lock).
  Status CheckSameCall() const {
    for (int r = 1; r < size_; ++r) {
      if (!SameCall(slots_[0], slots_[r])) {
        return absl::InvalidArgumentError(StrCat("mismatched collectives: rank 0 called ",
                                                 Describe(slots_[0]), " but rank ", r, " called ",
                                                 Describe(slots_[r])));
      }
    }
    return absl::OkStatus();
  }

  Status Broken() const {
    return absl::FailedPreconditionError(
        "loopback group is unusable after an earlier collective timed out");
  }

  const int size_;
  const LoopbackSends sends_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int arrived_ = 0;
  bool broken_ = false;
  std::vector<Slot> slots_;
  Status verdict_;  // of the last rendezvous that published slots
  std::vector<std::byte> scratch_;
  std::vector<SplitResult> split_results_;
  std::map<std::pair<int, int>, std::vector<Message>> mailboxes_;
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(std::shared_ptr<LoopbackGroup> group, int rank, CommOptions options,
                       Watchdog* watchdog)
      : Communicator(rank, group->size(), "loopback", std::move(options), watchdog),
        group_(std::move(group)),
        // With a watchdog the process exits at the deadline; the threads' own deadline comes
        // a little later so that the watchdog's report, not a partial error, is what is seen.
        wait_(this->options().timeout +
              (watchdog != nullptr ? std::chrono::seconds(5) : std::chrono::seconds(0))) {}

  std::string_view backend() const override { return "loopback"; }
  std::string algorithm(CollectiveOp op) const override {
    switch (op) {
      case CollectiveOp::kAllReduce:
        return "shared memory: reduce-scatter into a group buffer, then copy";
      case CollectiveOp::kReduceScatter:
        return "shared memory: each rank reduces its block";
      case CollectiveOp::kAllGather:
        return "shared memory: each rank copies every block";
      default:
        return "shared memory";
    }
  }

 protected:
  bool host_buffers() const override { return true; }

  Status DoAllGather(const void* send, void* recv, size_t count, DType dtype, Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kAllGather, send, recv, count, dtype};
    ZR_RETURN_IF_ERROR(Begin(slot));
    const size_t bytes = count * DTypeSize(dtype);
    for (int r = 0; r < size(); ++r) {
      char* dst = static_cast<char*>(recv) + static_cast<size_t>(r) * bytes;
      if (dst != group_->slot(r).send) CopyHost(dst, group_->slot(r).send, bytes);
    }
    return Arrive(nullptr);
  }

  Status DoReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kReduceScatter, send, recv, count, dtype, op};
    ZR_RETURN_IF_ERROR(Begin(slot));
    internal::ReduceHost(Inputs(), static_cast<size_t>(rank()) * count, recv, count, dtype, op);
    return Arrive(nullptr);
  }

  Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kAllReduce, send, recv, count, dtype, op};
    const size_t elem = DTypeSize(dtype);
    ZR_RETURN_IF_ERROR(Begin(slot, [&] {
      if (group_->scratch().size() < count * elem) group_->scratch().resize(count * elem);
    }));
    // Each rank reduces one chunk into the group buffer, then everyone copies the whole result:
    // inputs are read before any output is written, so send == recv is safe.
    const size_t chunk = (count + size() - 1) / size();
    const size_t begin = std::min(count, chunk * rank());
    const size_t n = std::min(count, begin + chunk) - begin;
    internal::ReduceHost(Inputs(), begin, group_->scratch().data() + begin * elem, n, dtype, op);
    ZR_RETURN_IF_ERROR(Arrive(nullptr));
    CopyHost(recv, group_->scratch().data(), count * elem);
    return Arrive(nullptr);
  }

  Status DoBroadcast(void* buffer, size_t count, DType dtype, int root, Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kBroadcast, buffer, buffer, count, dtype, ReduceOp::kSum, root};
    ZR_RETURN_IF_ERROR(Begin(slot));
    if (rank() != root) CopyHost(buffer, group_->slot(root).send, count * DTypeSize(dtype));
    return Arrive(nullptr);
  }

  Status DoSend(const void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Post(buffer, count, dtype, peer);
    return InOrder();  // a blocking send ends when received (kRendezvous)
  }

  Status DoRecv(void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    return Take(buffer, count, dtype, peer);
  }

  // Takes the next message from `peer` into `buffer`.
  Status Take(void* buffer, size_t count, DType dtype, int peer) {
    ZR_ASSIGN_OR_RETURN(Message message, group_->Take(peer, rank(), Clock::now() + wait_));
    if (message.count != count || message.dtype != dtype) {
      return absl::InvalidArgumentError(StrCat("recv of ", count, " ", DTypeName(dtype),
                                               " from rank ", peer, " matched a send of ",
                                               message.count, " ", DTypeName(message.dtype)));
    }
    CopyHost(buffer, message.data.data(), message.data.size());
    return absl::OkStatus();
  }

  Status DoSendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                    int src, DType dtype, Stream* stream) override {
    const P2POp ops[] = {{P2POp::kSend, const_cast<void*>(send), send_count, dst},
                         {P2POp::kRecv, recv, recv_count, src}};
    return DoExchange(ops, dtype, stream);
  }

  // A group: its sends are posted first, so its own receives cannot wait on them; it ends when
  // its receives have their data and (kRendezvous) its sends were received.
  Status DoExchange(std::span<const P2POp> ops, DType dtype, Stream*) override {
    ZR_RETURN_IF_ERROR(InOrder());
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::kSend) Post(op.buffer, op.count, dtype, op.peer);
    }
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::kRecv) ZR_RETURN_IF_ERROR(Take(op.buffer, op.count, dtype, op.peer));
    }
    return InOrder();
  }

  // kBuffered: complete when posted. kRendezvous: complete when received; meanwhile the
  // communicator's later operations wait (InOrder), as NCCL's would.
  Status DoPostSend(const void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    Post(buffer, count, dtype, peer);
    ++posted_;
    return absl::OkStatus();
  }
  StatusOr<size_t> DoPollSends() override {
    const size_t taken = group_->CountTaken(unreceived_);  // the oldest, in posting order
    unreceived_.erase(unreceived_.begin(),
                      unreceived_.begin() + static_cast<std::ptrdiff_t>(taken));
    const size_t done = posted_ - std::min(posted_, unreceived_.size());
    posted_ -= done;
    return done;
  }
  Status DoWaitSends() override {
    ZR_RETURN_IF_ERROR(InOrder());
    posted_ = 0;
    return absl::OkStatus();
  }

  Status DoBarrier() override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kBarrier};
    return Begin(slot);
  }

  StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key,
                                                  CommOptions options) override {
    ZR_RETURN_IF_ERROR(InOrder());
    Slot slot{CollectiveOp::kSplit};
    slot.color = color;
    slot.key = key;
    ZR_RETURN_IF_ERROR(Begin(slot, [&] {
      std::map<int, std::vector<std::pair<int, int>>> members;  // colour -> (key, rank)
      for (int r = 0; r < size(); ++r) {
        const Slot& s = group_->slot(r);
        if (s.color != kNoColor) members[s.color].emplace_back(s.key, r);
      }
      for (auto& [c, list] : members) {
        std::sort(list.begin(), list.end());
        auto group =
            std::make_shared<LoopbackGroup>(static_cast<int>(list.size()), group_->sends());
        for (size_t i = 0; i < list.size(); ++i) {
          group_->split_results()[list[i].second] = SplitResult{group, static_cast<int>(i)};
        }
      }
    }));
    SplitResult result = std::move(group_->split_results()[rank()]);
    group_->split_results()[rank()] = SplitResult{};
    ZR_RETURN_IF_ERROR(Arrive(nullptr));
    if (color == kNoColor) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new LoopbackCommunicator(
        std::move(result.group), result.rank, std::move(options), watchdog()));
  }

 private:
  Status Arrive(const Slot* slot, const std::function<void()>& on_last = {}) {
    return group_->Arrive(rank(), slot, Clock::now() + wait_, on_last);
  }

  // First rendezvous of a collective: publishes this rank's call; every rank gets the same
  // verdict on whether all made the same call, so on a mismatch all fail together.
  Status Begin(const Slot& slot, const std::function<void()>& on_last = {}) {
    return Arrive(&slot, on_last);
  }

  void Post(const void* buffer, size_t count, DType dtype, int peer) {
    const auto* bytes = static_cast<const std::byte*>(buffer);
    std::shared_ptr<bool> taken = group_->Post(
        rank(), peer,
        Message{std::vector<std::byte>(bytes, bytes + count * DTypeSize(dtype)), count, dtype, {}});
    if (group_->sends() == LoopbackSends::kRendezvous) unreceived_.emplace_back(peer, taken);
  }

  // kRendezvous: an operation starts once this rank's earlier sends on this communicator were
  // received (NCCL runs a communicator's operations in issue order). kBuffered: at once.
  Status InOrder() {
    if (unreceived_.empty()) return absl::OkStatus();
    ZR_RETURN_IF_ERROR(group_->WaitTaken(rank(), unreceived_, Clock::now() + wait_));
    unreceived_.clear();
    return absl::OkStatus();
  }

  std::vector<const void*> Inputs() const {
    std::vector<const void*> inputs(size());
    for (int r = 0; r < size(); ++r) inputs[r] = group_->slot(r).send;
    return inputs;
  }

  std::shared_ptr<LoopbackGroup> group_;
  const Clock::duration wait_;
  size_t posted_ = 0;  // posted sends not yet reported complete
  // kRendezvous: this rank's sends not yet known to be received, oldest first, with their peer.
  std::deque<std::pair<int, std::shared_ptr<bool>>> unreceived_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLoopbackGroup(int size,
                                                                         CommOptions options,
                                                                         Watchdog* watchdog,
                                                                         LoopbackSends sends) {
  if (size < 1) {
    return absl::InvalidArgumentError(StrCat("loopback group size ", size, " is below 1"));
  }
  auto group = std::make_shared<LoopbackGroup>(size, sends);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) {
    comms.push_back(std::make_unique<LoopbackCommunicator>(group, r, options, watchdog));
  }
  return comms;
}

Status RunLoopbackRanks(int size, CommOptions options, Watchdog* watchdog,
                        const std::function<Status(Communicator&)>& body, LoopbackSends sends) {
  ZR_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms,
                      CreateLoopbackGroup(size, std::move(options), watchdog, sends));
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { results[r] = body(*comms[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    if (!results[r].ok()) return Annotate(results[r], StrCat("loopback rank ", r));
  }
  return absl::OkStatus();
}

}  // namespace zerort
