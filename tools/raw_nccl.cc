// Raw NCCL collectives for the benchmark baseline.
#include "raw_nccl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

ncclDataType_t Type(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    default:
      return ncclFloat32;
  }
}

class RawNcclImpl final : public RawNccl {
 public:
  explicit RawNcclImpl(ncclComm_t comm) : comm_(comm) {}
  ~RawNcclImpl() override { ncclCommDestroy(comm_); }
  Status Run(CollectiveOp op, const void* send, void* recv, size_t count, DType dtype,
             Stream& stream) override {
    auto s = static_cast<cudaStream_t>(stream.native_handle());
    ncclResult_t r = ncclSuccess;
    switch (op) {
      case CollectiveOp::kAllGather:
        r = ncclAllGather(send, recv, count, Type(dtype), comm_, s);
        break;
      case CollectiveOp::kReduceScatter:
        r = ncclReduceScatter(send, recv, count, Type(dtype), ncclSum, comm_, s);
        break;
      case CollectiveOp::kAllReduce:
        r = ncclAllReduce(send, recv, count, Type(dtype), ncclSum, comm_, s);
        break;
      default:
        return absl::InvalidArgumentError("no raw NCCL baseline for this operation");
    }
    if (r != ncclSuccess) return absl::InternalError(StrCat("raw NCCL: ", ncclGetErrorString(r)));
    return absl::OkStatus();
  }

 private:
  ncclComm_t comm_;
};

}  // namespace

StatusOr<std::unique_ptr<RawNccl>> CreateRawNccl(Device device) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ncclUniqueId id{};
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    return absl::InternalError("raw NCCL: ncclGetUniqueId failed");
  }
  if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    return absl::InternalError("raw NCCL: MPI_Bcast of the unique id failed");
  }
  if (cudaSetDevice(device.index) != cudaSuccess) {
    return absl::InternalError(StrCat("raw NCCL: cudaSetDevice(", device.index, ") failed"));
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, size, id, rank);
  if (r != ncclSuccess) {
    return absl::InternalError(StrCat("raw NCCL: ncclCommInitRank: ", ncclGetErrorString(r)));
  }
  return std::unique_ptr<RawNccl>(new RawNcclImpl(comm));
}

}  // namespace zerort::cli
