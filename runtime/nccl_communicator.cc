// The NCCL communicator: non-blocking NCCL with event probes for the watchdog.
#include "runtime/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <deque>
#include <map>

#include <thread>

#include "runtime/internal/cuda_check.h"
#include "runtime/strings.h"
#include "runtime/watchdog.h"

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

// Waits until a non-blocking communicator has finished the host side of the last call.
Status WaitReady(ncclComm_t comm, Clock::time_point deadline, std::string_view call) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result, comm);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(call, state, comm);
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(StrCat(call, " did not finish in time"));
    }
    std::this_thread::yield();
  }
}

#define ZR_NCCL_CALL(call)                                                         \
  do {                                                                             \
    const ncclResult_t zr_nccl_result_ = (call);                                   \
    if (zr_nccl_result_ != ncclSuccess && zr_nccl_result_ != ncclInProgress) {     \
      return NcclError(#call, zr_nccl_result_, comm_);                             \
    }                                                                              \
    ZR_RETURN_IF_ERROR(WaitReady(comm_, Clock::now() + options().timeout, #call)); \
  } while (false)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, Device device, int rank, int size, CommOptions options,
                   Watchdog* watchdog)
      : Communicator(rank, size, "nccl", std::move(options), watchdog,
                     [comm] { ncclCommAbort(comm); }),
        comm_(comm),
        device_(device) {}
  ~NcclCommunicator() override {
    for (auto& [peer, st] : send_streams_) cudaStreamDestroy(st);
    for (cudaEvent_t e : posted_) cudaEventDestroy(e);
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
    if (barrier_stream_ != nullptr) cudaStreamDestroy(barrier_stream_);
    ncclCommFinalize(comm_);
    WaitReady(comm_, Clock::now() + std::chrono::seconds(30), "ncclCommFinalize").IgnoreError();
    ncclCommDestroy(comm_);
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
    ZR_NCCL_CALL(ncclAllGather(send, recv, count, NcclType(dtype), comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(
        ncclReduceScatter(send, recv, count, NcclType(dtype), NcclOp(op), comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoAllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(
        ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op), comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoBroadcast(void* buffer, size_t count, DType dtype, int root, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(
        ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoSend(const void* buffer, size_t count, DType dtype, int peer, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclSend(buffer, count, NcclType(dtype), peer, comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoRecv(void* buffer, size_t count, DType dtype, int peer, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ZR_NCCL_CALL(ncclRecv(buffer, count, NcclType(dtype), peer, comm_, Native(stream)));
    return absl::OkStatus();
  }

  Status DoSendRecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count,
                    int src, DType dtype, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ncclGroupStart();
    ncclResult_t sent = ncclSend(send, send_count, NcclType(dtype), dst, comm_, Native(stream));
    ncclResult_t received = ncclRecv(recv, recv_count, NcclType(dtype), src, comm_, Native(stream));
    ncclResult_t grouped = ncclGroupEnd();
    for (ncclResult_t r : {sent, received, grouped}) {
      if (r != ncclSuccess && r != ncclInProgress)
        return NcclError("ncclSend/ncclRecv group", r, comm_);
    }
    return WaitReady(comm_, Clock::now() + options().timeout, "ncclGroupEnd");
  }

  Status DoExchange(std::span<const P2POp> ops, DType dtype, Stream* stream) override {
    ZR_RETURN_IF_ERROR(CheckDevice(stream));
    ncclGroupStart();
    ncclResult_t first_error = ncclSuccess;
    for (const P2POp& op : ops) {
      const ncclResult_t r =
          op.kind == P2POp::kSend
              ? ncclSend(op.buffer, op.count, NcclType(dtype), op.peer, comm_, Native(stream))
              : ncclRecv(op.buffer, op.count, NcclType(dtype), op.peer, comm_, Native(stream));
      if (first_error == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first_error = r;
    }
    const ncclResult_t grouped = ncclGroupEnd();
    for (ncclResult_t r : {first_error, grouped}) {
      if (r != ncclSuccess && r != ncclInProgress) {
        return NcclError("ncclSend/ncclRecv group", r, comm_);
      }
    }
    return WaitReady(comm_, Clock::now() + options().timeout, "ncclGroupEnd");
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
    ZR_NCCL_CALL(ncclSend(buffer, count, NcclType(dtype), peer, comm_, on));
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
        ZR_RETURN_IF_ERROR(WaitReady(comm_, deadline, "posted ncclSend"));
        if (Clock::now() > deadline) {
          ncclCommAbort(comm_);
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
    ZR_NCCL_CALL(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_,
                               barrier_stream_));
    // Poll rather than block, so a hung peer is caught by the deadline, not the driver.
    const Clock::time_point deadline = Clock::now() + options().timeout;
    while (true) {
      ZR_ASSIGN_OR_RETURN(
          const bool done,
          internal::CudaQueryResult("cudaStreamQuery(barrier)", cudaStreamQuery(barrier_stream_)));
      if (done) return absl::OkStatus();
      ZR_RETURN_IF_ERROR(WaitReady(comm_, deadline, "barrier"));
      if (Clock::now() > deadline) {
        ncclCommAbort(comm_);
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
        ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config));
    if (child == nullptr) return std::unique_ptr<Communicator>();
    ZR_RETURN_IF_ERROR(WaitReady(child, Clock::now() + child_options.timeout, "ncclCommSplit"));
    int rank = 0;
    int size = 0;
    ncclCommUserRank(child, &rank);
    ncclCommCount(child, &size);
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(child, device_, rank, size, std::move(child_options), watchdog()));
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
    ncclComm_t comm = comm_;
    return [owned, comm]() -> StatusOr<bool> {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError("asynchronous NCCL error", state, comm);
      }
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

  ncclComm_t comm_;
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
  ZR_RETURN_IF_ERROR(WaitReady(comm, Clock::now() + options.timeout, "ncclCommInitRankConfig"));
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      comm, device, bootstrap.rank(), bootstrap.size(), std::move(options), watchdog));
}

std::string NcclVersion() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return StrCat(version / 10000, ".", (version / 100) % 100, ".", version % 100);
}

}  // namespace zerort
