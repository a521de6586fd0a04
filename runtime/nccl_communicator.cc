// The NCCL communicator: non-blocking NCCL with event probes for the watchdog.
#include "zerort/runtime/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <deque>
#include <map>
#include <mutex>

#include <thread>

#include "zerort/runtime/internal/cuda_check.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {
namespace {

Status NcclError(std::string_view call, ncclResult_t result, ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::InternalError(
      StrCat(call, " failed: ", ncclGetErrorString(result),
             last != nullptr && *last ? StrCat(" (", last, ")") : std::string()));
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// [Note: an NCCL communicator is aborted at most once]
// ncclCommAbort frees the communicator. Three paths abort one: a call whose host side passes its
// deadline (WaitReady), a send or barrier wait that passes it, and the watchdog thread when a
// collective's probe is overdue. Each used to call ncclCommAbort itself, so a timeout aborted
// twice and the destructor then finalised and destroyed the freed communicator: a crash in place
// of the hang report. NcclHandle owns the ncclComm_t, shared by the communicator, its probes and
// the watchdog's abort: Abort() aborts once and forgets the communicator; afterwards every call
// fails with kAborted naming what it was, probes report the abort, and Close() (the
// communicator's destructor) finalises and destroys only a communicator nobody aborted. The mutex
// orders Abort against the calls that use the handle; each NCCL call is short (the communicator
// is non-blocking), so the watchdog never waits on a hung collective.
class NcclHandle {
 public:
  explicit NcclHandle(ncclComm_t comm) : comm_(comm) {}
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ~NcclHandle() { Close(); }

  // Runs `call` on the communicator, or returns ncclInvalidUsage once it is aborted or closed.
  template <typename F>
  ncclResult_t Call(F&& call) {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return ncclInvalidUsage;
    return call(comm_);
  }

  Status Error(std::string_view call, ncclResult_t result) {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return Gone(call);
    return NcclError(call, result, comm_);
  }

  // Waits until the communicator has finished the host side of the last call; past `deadline`
  // it is aborted.
  Status WaitReady(Clock::time_point deadline, std::string_view call) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard lock(mu_);
        if (comm_ == nullptr) return Gone(call);
        const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
        if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result, comm_);
        if (state != ncclSuccess && state != ncclInProgress) return NcclError(call, state, comm_);
      }
      if (state == ncclSuccess) return absl::OkStatus();
      if (Clock::now() > deadline) {
        Abort(StrCat(call, " did not finish in time"));
        return absl::DeadlineExceededError(StrCat(call, " did not finish in time"));
      }
      std::this_thread::yield();
    }
  }

  // The communicator's asynchronous error for a probe: OK while it is healthy.
  Status AsyncError() {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return Gone("the collective");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclError("asynchronous NCCL error", state, comm_);
    }
    return absl::OkStatus();
  }

  void Abort(std::string why) {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = std::move(why);
  }

  // Finalises and destroys the communicator unless it was aborted (or closed before).
  void Close() {
    std::lock_guard lock(mu_);
    if (comm_ == nullptr) return;
    ncclCommFinalize(comm_);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && Clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      std::this_thread::yield();
    }
    if (state == ncclInProgress) {
      ncclCommAbort(comm_);  // finalisation hung: free it without waiting
    } else {
      ncclCommDestroy(comm_);
    }
    comm_ = nullptr;
    aborted_ = "closed";
  }

  bool aborted() {
    std::lock_guard lock(mu_);
    return comm_ == nullptr;
  }

 private:
  Status Gone(std::string_view call) const {
    return absl::AbortedError(StrCat(call, ": the NCCL communicator was aborted (", aborted_,
                                     "); nothing more can run on it"));
  }

  std::mutex mu_;
  ncclComm_t comm_;      // null once aborted or closed
  std::string aborted_;  // why, for the errors that follow
};

// Runs an NCCL call on `handle_` (the expression names the communicator `comm`), then waits for
// its host side.
#define ZR_NCCL_CALL(expr)                                                                       \
  do {                                                                                           \
    const ncclResult_t zr_nccl_result_ = handle_->Call([&](ncclComm_t comm) { return (expr); }); \
    if (zr_nccl_result_ != ncclSuccess && zr_nccl_result_ != ncclInProgress) {                   \
      return handle_->Error(#expr, zr_nccl_result_);                                             \
    }                                                                                            \
    ZR_RETURN_IF_ERROR(handle_->WaitReady(Clock::now() + options().timeout, #expr));             \
  } while (false)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclHandle> handle, Device device, int rank, int size,
                   CommOptions options, Watchdog* watchdog)
      : Communicator(rank, size, "nccl", std::move(options), watchdog,
                     [handle] { handle->Abort("the watchdog aborted it"); }),
        handle_(std::move(handle)),
        device_(device) {}
  ~NcclCommunicator() override {
    for (auto& [peer, st] : send_streams_) cudaStreamDestroy(st);
    for (cudaEvent_t e : posted_) cudaEventDestroy(e);
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
    if (barrier_stream_ != nullptr) cudaStreamDestroy(barrier_stream_);
    handle_->Close();
  }

  std::string_view backend() const override { return "nccl"; }
  std::string algorithm(CollectiveOp op) const override {
    return "NCCL (ring/tree chosen by NCCL)";
  }

 protected:
  bool host_buffers() const override { return false; }

  Status DoAllGather(const void* send, void* recv, size_t count, DType dtype,
                     Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclAllGather(send, recv, count, NcclType(dtype), comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(
        ncclReduceScatter(send, recv, count, NcclType(dtype), NcclOp(op), comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(
        ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op), comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoBroadcast(void* buffer, size_t count, DType dtype, int root, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoSend(const void* buffer, size_t count, DType dtype, int peer, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclSend(buffer, count, NcclType(dtype), peer, comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoRecv(void* buffer, size_t count, DType dtype, int peer, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclRecv(buffer, count, NcclType(dtype), peer, comm, Native(stream)));
    return absl::OkStatus();
  }

  Status DoSendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                    int src, DType dtype, Stream* stream) override {
    const P2POp ops[] = {{P2POp::kSend, const_cast<void*>(send), send_count, dst},
                         {P2POp::kRecv, recv, recv_count, src}};
    return DoExchange(ops, dtype, stream);
  }

  Status DoExchange(std::span<const P2POp> ops, DType dtype, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    // The whole group in one Call: an abort cannot land between its start and its end.
    const ncclResult_t result = handle_->Call([&](ncclComm_t comm) {
      ncclGroupStart();
      ncclResult_t first_error = ncclSuccess;
      for (const P2POp& op : ops) {
        const ncclResult_t r =
            op.kind == P2POp::kSend
                ? ncclSend(op.buffer, op.count, NcclType(dtype), op.peer, comm, Native(stream))
                : ncclRecv(op.buffer, op.count, NcclType(dtype), op.peer, comm, Native(stream));
        if (first_error == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first_error = r;
      }
      const ncclResult_t grouped = ncclGroupEnd();
      return first_error != ncclSuccess ? first_error : grouped;
    });
    if (result != ncclSuccess && result != ncclInProgress) {
      return handle_->Error("ncclSend/ncclRecv group", result);
    }
    return handle_->WaitReady(Clock::now() + options().timeout, "ncclGroupEnd");
  }

  // Posted sends run on a stream per peer, after the work that wrote their buffer: one that
  // waits for its receive holds up only later sends to the same peer (in the receiver's order).
  Status DoPostSend(const void* buffer, size_t count, DType dtype, int peer,
                    Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    cudaStream_t& on = send_streams_[peer];
    if (on == nullptr)
      ZR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&on, cudaStreamNonBlocking));
    cudaEvent_t ready = nullptr, done = nullptr;
    ZR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ZR_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready, Native(stream)));
    const cudaError_t waited = cudaStreamWaitEvent(on, ready, 0);
    cudaEventDestroy(ready);
    ZR_CUDA_RETURN_IF_ERROR(waited);
    ZR_NCCL_CALL(ncclSend(buffer, count, NcclType(dtype), peer, comm, on));
    ZR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ZR_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, on));
    posted_.push_back(done);
    return absl::OkStatus();
  }

  StatusOr<size_t> DoPollSends() override {
    size_t done = 0;
    while (!posted_.empty()) {
      const StatusOr<bool> sent =
          internal::CudaQueryResult("cudaEventQuery(posted send)", cudaEventQuery(posted_.front()));
      if (sent.ok() && !*sent) break;
      cudaEventDestroy(posted_.front());
      posted_.pop_front();
      if (!sent.ok()) return sent.status();
      ++done;
    }
    return done;
  }

  Status DoWaitSends() override {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    while (!posted_.empty()) {
      ZR_ASSIGN_OR_RETURN(size_t done, DoPollSends());
      if (done == 0) {
        ZR_RETURN_IF_ERROR(handle_->WaitReady(deadline, "posted ncclSend"));
        if (Clock::now() > deadline) {
          handle_->Abort("posted sends did not finish in time");
          return absl::DeadlineExceededError("posted NCCL sends did not finish in time");
        }
        std::this_thread::yield();
      }
    }
    return absl::OkStatus();
  }

  Status DoBarrier() override {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    if (barrier_stream_ == nullptr) {
      ZR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&barrier_stream_, cudaStreamNonBlocking));
      ZR_CUDA_RETURN_IF_ERROR(cudaMalloc(&barrier_scratch_, sizeof(float)));
    }
    ZR_NCCL_CALL(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm,
                               barrier_stream_));
    // Poll rather than block, so a hung peer is caught by the deadline, not the driver.
    const Clock::time_point deadline = Clock::now() + options().timeout;
    while (true) {
      ZR_ASSIGN_OR_RETURN(
          const bool done,
          internal::CudaQueryResult("cudaStreamQuery(barrier)", cudaStreamQuery(barrier_stream_)));
      if (done) return absl::OkStatus();
      ZR_RETURN_IF_ERROR(handle_->WaitReady(deadline, "barrier"));
      if (Clock::now() > deadline) {
        handle_->Abort("a barrier did not finish in time");
        return absl::DeadlineExceededError("NCCL barrier did not finish in time");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key,
                                                  CommOptions child_options) override {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    ZR_NCCL_CALL(
        ncclCommSplit(comm, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config));
    if (child == nullptr) return std::unique_ptr<Communicator>();
    auto handle = std::make_shared<NcclHandle>(child);
    ZR_RETURN_IF_ERROR(handle->WaitReady(Clock::now() + child_options.timeout, "ncclCommSplit"));
    int rank = 0;
    int size = 0;
    ncclCommUserRank(child, &rank);
    ncclCommCount(child, &size);
    return std::unique_ptr<Communicator>(new NcclCommunicator(
        std::move(handle), device_, rank, size, std::move(child_options), watchdog()));
  }

  CompletionProbe MakeProbe(Stream* stream) override {
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(event, Native(stream)) != cudaSuccess) {
      cudaGetLastError();
      if (event != nullptr) cudaEventDestroy(event);
      return {};
    }
    auto owned = std::shared_ptr<CUevent_st>(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
    return [owned, handle = handle_]() -> StatusOr<bool> {
      ZR_RETURN_IF_ERROR(handle->AsyncError());
      return internal::CudaQueryResult("cudaEventQuery", cudaEventQuery(owned.get()));
    };
  }

 private:
  Status CheckDevice(Stream* stream) const {
    if (stream->device() != device_) {
      return absl::InvalidArgumentError(StrCat("NCCL communicator of ", device_.ToString(),
                                               " used with a stream of ",
                                               stream->device().ToString()));
    }
    return absl::OkStatus();
  }
  static cudaStream_t Native(Stream* stream) {
    return static_cast<cudaStream_t>(stream->native_handle());
  }

  std::shared_ptr<NcclHandle> handle_;  // [Note: an NCCL communicator is aborted at most once]
  Device device_;
  cudaStream_t barrier_stream_ = nullptr;
  float* barrier_scratch_ = nullptr;
  std::map<int, cudaStream_t> send_streams_;  // PostSend's, per peer
  std::deque<cudaEvent_t> posted_;            // each posted send's end, oldest first
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                               Device device, CommOptions options,
                                                               Watchdog* watchdog) {
  if (!device.is_cuda() || device.index >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        StrCat("NCCL needs a CUDA device; ", device.ToString(), " is not available (",
               CudaDeviceCount(), " visible", QueryCuda().unavailable_reason.empty() ? "" : ": ",
               QueryCuda().unavailable_reason, ")"));
  }
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result, nullptr);
  }
  ZR_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id), DType::kU8, 0));
  ZR_RETURN_IF_ERROR(SetCurrentDevice(device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result =
      ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    return NcclError("ncclCommInitRankConfig", result, comm);
  }
  auto handle = std::make_shared<NcclHandle>(comm);
  ZR_RETURN_IF_ERROR(handle->WaitReady(Clock::now() + options.timeout, "ncclCommInitRankConfig"));
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      std::move(handle), device, bootstrap.rank(), bootstrap.size(), std::move(options), watchdog));
}

std::string NcclVersion() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return StrCat(version / 10000, ".", (version / 100) % 100, ".", version % 100);
}

}  // namespace zerort
