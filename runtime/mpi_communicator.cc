// The MPI communicator: blocking MPI collectives, fp32 reductions for 16-bit floats.
#include "zerort/runtime/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "zerort/runtime/internal/host_reduce.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status MpiError(std::string_view call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return absl::InternalError(
      StrCat(call, " failed: ", std::string_view(text, length), " (MPI error ", code, ")"));
}

#define ZR_MPI_RETURN_IF_ERROR(call)                            \
  do {                                                          \
    if (int zr_mpi_err_ = (call); zr_mpi_err_ != MPI_SUCCESS) { \
      return MpiError(#call, zr_mpi_err_);                      \
    }                                                           \
  } while (false)

// The MPI type that moves `dtype`'s bits (16-bit floats move as uint16).
MPI_Datatype MoveType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiOp(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// Reductions MPI cannot be trusted with directly: 16-bit floats (no MPI type; reduced in fp32,
// rounded once) and 8-bit sums (Open MPI 4.1's AVX reduction saturates them instead of wrapping;
// reduced in int32, wrapped on the way back).
bool Widened(DType dtype, ReduceOp op) {
  return dtype == DType::kBF16 || dtype == DType::kF16 ||
         (dtype == DType::kU8 && op == ReduceOp::kSum);
}
DType WideType(DType dtype) { return dtype == DType::kU8 ? DType::kI32 : DType::kF32; }

void Widen(const void* src, DType dtype, void* dst, size_t count) {
  if (dtype == DType::kU8) {
    for (size_t i = 0; i < count; ++i)
      static_cast<int32_t*>(dst)[i] = static_cast<const uint8_t*>(src)[i];
  } else {
    internal::ToFloat32(src, dtype, static_cast<float*>(dst), count);
  }
}

void Narrow(const void* src, void* dst, DType dtype, size_t count) {
  if (dtype == DType::kU8) {
    for (size_t i = 0; i < count; ++i) {
      static_cast<uint8_t*>(dst)[i] =
          static_cast<uint8_t>(static_cast<const int32_t*>(src)[i] & 0xff);
    }
  } else {
    internal::FromFloat32(static_cast<const float*>(src), dst, dtype, count);
  }
}

StatusOr<int> ToInt(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    return absl::UnimplementedError(
        StrCat("a single MPI message of ", count, " elements exceeds MPI's int count; split it"));
  }
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, CommOptions options, Watchdog* watchdog)
      : Communicator(rank, size, "mpi", std::move(options), watchdog), comm_(comm) {}
  ~MpiCommunicator() override {
    if (progress_.joinable()) {
      {
        std::lock_guard lock(posted_mu_);
        stop_progress_ = true;
      }
      posted_cv_.notify_all();
      progress_.join();
    }
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  std::string_view backend() const override { return "mpi"; }
  std::string algorithm(CollectiveOp op) const override {
    switch (op) {
      case CollectiveOp::kAllGather:
        return "MPI_Allgather";
      case CollectiveOp::kReduceScatter:
        return "MPI_Reduce_scatter_block";
      case CollectiveOp::kAllReduce:
        return "MPI_Allreduce";
      default:
        return "MPI";
    }
  }

 protected:
  bool host_buffers() const override { return true; }

  Status DoAllGather(const void* send, void* recv, size_t count, DType dtype, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    const bool in_place = send == static_cast<char*>(recv) + count * DTypeSize(dtype) * rank();
    ZR_MPI_RETURN_IF_ERROR(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, MoveType(dtype), recv,
                                         n, MoveType(dtype), comm_));
    return absl::OkStatus();
  }

  Status DoReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    const size_t total = count * static_cast<size_t>(size());
    if (!Widened(dtype, op)) {
      // MPI's in-place form reads the input from recv, so an aliased send is copied first.
      std::vector<std::byte> copy;
      const void* input = send;
      if (recv == static_cast<const char*>(send) + count * DTypeSize(dtype) * rank()) {
        const auto* bytes = static_cast<const std::byte*>(send);
        copy.assign(bytes, bytes + total * DTypeSize(dtype));
        input = copy.data();
      }
      ZR_MPI_RETURN_IF_ERROR(
          MPI_Reduce_scatter_block(input, recv, n, MoveType(dtype), MpiOp(op), comm_));
      if (op == ReduceOp::kAvg) internal::DivideHost(recv, count, dtype, size());
      return absl::OkStatus();
    }
    const DType wide_type = WideType(dtype);
    std::vector<uint32_t> wide(total);  // 4-byte elements: fp32 or int32
    std::vector<uint32_t> result(count);
    Widen(send, dtype, wide.data(), total);
    ZR_MPI_RETURN_IF_ERROR(MPI_Reduce_scatter_block(wide.data(), result.data(), n,
                                                    MoveType(wide_type), MpiOp(op), comm_));
    if (op == ReduceOp::kAvg) internal::DivideHost(result.data(), count, wide_type, size());
    Narrow(result.data(), recv, dtype, count);
    return absl::OkStatus();
  }

  Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    if (!Widened(dtype, op)) {
      ZR_MPI_RETURN_IF_ERROR(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n,
                                           MoveType(dtype), MpiOp(op), comm_));
      if (op == ReduceOp::kAvg) internal::DivideHost(recv, count, dtype, size());
      return absl::OkStatus();
    }
    const DType wide_type = WideType(dtype);
    std::vector<uint32_t> wide(count);
    Widen(send, dtype, wide.data(), count);
    ZR_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, wide.data(), n, MoveType(wide_type), MpiOp(op), comm_));
    if (op == ReduceOp::kAvg) internal::DivideHost(wide.data(), count, wide_type, size());
    Narrow(wide.data(), recv, dtype, count);
    return absl::OkStatus();
  }

  Status DoBroadcast(void* buffer, size_t count, DType dtype, int root, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    ZR_MPI_RETURN_IF_ERROR(MPI_Bcast(buffer, n, MoveType(dtype), root, comm_));
    return absl::OkStatus();
  }

  Status DoSend(const void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    ZR_MPI_RETURN_IF_ERROR(MPI_Send(buffer, n, MoveType(dtype), peer, kTag, comm_));
    return absl::OkStatus();
  }

  Status DoRecv(void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    MPI_Status status;
    ZR_MPI_RETURN_IF_ERROR(MPI_Recv(buffer, n, MoveType(dtype), peer, kTag, comm_, &status));
    return CheckReceived(status, n, dtype, peer);
  }

  Status DoSendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                    int src, DType dtype, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int ns, ToInt(send_count));
    ZR_ASSIGN_OR_RETURN(int nr, ToInt(recv_count));
    MPI_Status status;
    ZR_MPI_RETURN_IF_ERROR(MPI_Sendrecv(send, ns, MoveType(dtype), dst, kTag, recv, nr,
                                        MoveType(dtype), src, kTag, comm_, &status));
    return CheckReceived(status, nr, dtype, src);
  }

  Status DoExchange(std::span<const P2POp> ops, DType dtype, Stream*) override {
    std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
    std::vector<int> counts(ops.size());
    Status status = absl::OkStatus();
    size_t posted = 0;
    for (; posted < ops.size() && status.ok(); ++posted) {
      const P2POp& op = ops[posted];
      StatusOr<int> n = ToInt(op.count);
      if (!n.ok()) {
        status = n.status();
        break;
      }
      counts[posted] = *n;
      const int rc =
          op.kind == P2POp::kSend
              ? MPI_Isend(op.buffer, *n, MoveType(dtype), op.peer, kTag, comm_, &requests[posted])
              : MPI_Irecv(op.buffer, *n, MoveType(dtype), op.peer, kTag, comm_, &requests[posted]);
      if (rc != MPI_SUCCESS)
        status = MpiError(op.kind == P2POp::kSend ? "MPI_Isend" : "MPI_Irecv", rc);
    }
    // Whatever was posted completes before the buffers go back to the caller.
    std::vector<MPI_Status> statuses(ops.size());
    const int rc = MPI_Waitall(static_cast<int>(posted), requests.data(), statuses.data());
    ZR_RETURN_IF_ERROR(status);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Waitall", rc);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == P2POp::kRecv) {
        ZR_RETURN_IF_ERROR(CheckReceived(statuses[i], counts[i], dtype, ops[i].peer));
      }
    }
    return absl::OkStatus();
  }

  Status DoPostSend(const void* buffer, size_t count, DType dtype, int peer, Stream*) override {
    ZR_ASSIGN_OR_RETURN(int n, ToInt(count));
    std::lock_guard lock(posted_mu_);
    MPI_Request request;
    ZR_MPI_RETURN_IF_ERROR(MPI_Isend(buffer, n, MoveType(dtype), peer, kTag, comm_, &request));
    posted_.push_back(request);
    if (!progress_.joinable()) {
      int level = MPI_THREAD_SINGLE;
      MPI_Query_thread(&level);
      if (level == MPI_THREAD_MULTIPLE) progress_ = std::thread([this] { Progress(); });
    }
    posted_cv_.notify_all();
    return absl::OkStatus();
  }

  StatusOr<size_t> DoPollSends() override {
    std::lock_guard lock(posted_mu_);
    size_t done = 0;
    while (!posted_.empty()) {
      int flag = 0;
      ZR_MPI_RETURN_IF_ERROR(MPI_Test(&posted_.front(), &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      posted_.pop_front();
      ++done;
    }
    return done;
  }

  Status DoWaitSends() override {
    std::vector<MPI_Request> all;
    {
      std::lock_guard lock(posted_mu_);
      all.assign(posted_.begin(), posted_.end());
      posted_.clear();
    }
    ZR_MPI_RETURN_IF_ERROR(
        MPI_Waitall(static_cast<int>(all.size()), all.data(), MPI_STATUSES_IGNORE));
    return absl::OkStatus();
  }

  Status DoBarrier() override {
    ZR_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_));
    return absl::OkStatus();
  }

  StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key,
                                                  CommOptions options) override {
    MPI_Comm child = MPI_COMM_NULL;
    ZR_MPI_RETURN_IF_ERROR(
        MPI_Comm_split(comm_, color == kNoColor ? MPI_UNDEFINED : color, key, &child));
    if (child == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    ZR_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN));
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(child, &rank);
    MPI_Comm_size(child, &size);
    return std::unique_ptr<Communicator>(
        new MpiCommunicator(child, rank, size, std::move(options), watchdog()));
  }

 private:
  static constexpr int kTag = 7001;

  Status CheckReceived(const MPI_Status& status, int expected, DType dtype, int peer) {
    int received = 0;
    MPI_Get_count(&status, MoveType(dtype), &received);
    if (received != expected) {
      return absl::InvalidArgumentError(
          StrCat("received ", received, " elements from rank ", peer, ", expected ", expected));
    }
    return absl::OkStatus();
  }

  // MPI moves a message only inside MPI calls: a large (rendezvous) Isend whose rank goes on
  // computing would wait for that rank's next MPI call, and its receiver with it (measured: a
  // pipeline stage's receive waited a whole forward of the sender). With MPI_THREAD_MULTIPLE this
  // thread tests the posted sends every 100 us while any is pending (a completed request becomes
  // MPI_REQUEST_NULL, which the caller's next poll counts), and sleeps otherwise.
  void Progress() {
    std::unique_lock lock(posted_mu_);
    while (!stop_progress_) {
      if (posted_.empty()) {
        posted_cv_.wait(lock);
        continue;
      }
      for (MPI_Request& request : posted_) {
        int flag = 0;
        if (request != MPI_REQUEST_NULL) MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
      }
      posted_cv_.wait_for(lock, std::chrono::microseconds(100));
    }
  }

  MPI_Comm comm_;
  std::mutex posted_mu_;  // posted_ and stop_progress_, shared with the progress thread
  std::condition_variable posted_cv_;
  std::deque<MPI_Request> posted_;  // PostSend's, oldest first
  bool stop_progress_ = false;
  std::thread progress_;  // started by the first PostSend under MPI_THREAD_MULTIPLE
};

}  // namespace

struct MpiContext::ExitBarrier {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  bool posted = false;
};

MpiContext::MpiContext() : exit_(std::make_unique<ExitBarrier>()) {}

StatusOr<std::unique_ptr<MpiContext>> MpiContext::Init(int* argc, char*** argv, Options options) {
  std::unique_ptr<MpiContext> context(new MpiContext());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&context->thread_level_);
  } else {
    ZR_MPI_RETURN_IF_ERROR(
        MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &context->thread_level_));
    context->owns_init_ = true;
  }
  if (context->thread_level_ < MPI_THREAD_SERIALIZED) {
    Logger()->warn("MPI provides thread level {} only; zerort calls MPI from one thread at a time",
                   context->thread_level_);
  }
  ZR_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_Comm_rank(MPI_COMM_WORLD, &context->world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &context->world_size_);
  // [Note: leaving after an error]: the exit's own communicator.
  ZR_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &context->exit_->comm));
  context->watchdog_ = std::make_unique<Watchdog>(std::move(options.watchdog));
  if (options.install_signal_dump) ZR_RETURN_IF_ERROR(context->watchdog_->InstallSignalDump());
  return context;
}

bool MpiContext::thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

void MpiContext::EndAfterError(int exit_code, std::chrono::milliseconds grace) {
  ExitBarrier& e = *exit_;
  if (e.comm == MPI_COMM_NULL || world_size_ == 1) return;
  if (!e.posted) {
    if (MPI_Ibarrier(e.comm, &e.request) != MPI_SUCCESS) return;  // the destructor finalises
    e.posted = true;
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (true) {
    int done = 0;
    if (MPI_Test(&e.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Logger()->error(
      "rank {}/{} stops on the error above; the other ranks did not reach the exit within {} s "
      "(they wait in a collective this rank will not join): ending the job now (MPI_Abort, exit "
      "code {})",
      world_rank_, world_size_, std::chrono::duration<double>(grace).count(), exit_code);
  Logger()->flush();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

MpiContext::~MpiContext() {
  watchdog_.reset();
  // [Note: leaving after an error]: meet the other ranks (a rank that failed waits here for us).
  ExitBarrier& e = *exit_;
  if (e.comm != MPI_COMM_NULL) {
    if (!e.posted && MPI_Ibarrier(e.comm, &e.request) == MPI_SUCCESS) e.posted = true;
    if (e.posted) MPI_Wait(&e.request, MPI_STATUS_IGNORE);
    MPI_Comm_free(&e.comm);
  }
  if (owns_init_) MPI_Finalize();
}

StatusOr<std::unique_ptr<Communicator>> MpiContext::World(CommOptions options) {
  return std::unique_ptr<Communicator>(new MpiCommunicator(MPI_COMM_WORLD, world_rank_, world_size_,
                                                           std::move(options), watchdog_.get()));
}

std::string MpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, length);
  return version.substr(0, version.find_first_of("\n,"));
}

}  // namespace zerort
