// [Note: qgZ] (quantized_reduce.h).
#include "zerort/sharding/quantized_reduce.h"

#include "zerort/kernels/quantize.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/reduce_plan.h"

namespace zerort {

QuantizedReduceScatter::QuantizedReduceScatter(Communicator& group, Communicator& intra,
                                               Communicator* inter, Allocator& memory,
                                               Stream& host_stream)
    : group_(group), intra_(intra), inter_(inter), memory_(memory), host_stream_(host_stream) {}

Status QuantizedReduceScatter::MapRanks() {
  const int nodes = inter_ != nullptr ? inter_->size() : 1, local = intra_.size();
  if (nodes * local != group_.size()) {
    return absl::InvalidArgumentError(StrCat("quantized gradients: ", nodes, " nodes x ", local,
                                             " ranks per node are not the ", group_.size(),
                                             " ranks of the data-parallel group"));
  }
  const int32_t mine[2] = {inter_ != nullptr ? inter_->rank() : 0, intra_.rank()};
  std::vector<int32_t> all(2 * static_cast<size_t>(group_.size()));
  ZR_RETURN_IF_ERROR(
      AllGatherHostValues(group_, memory_, host_stream_, mine, all.data(), 2, DType::kI32));
  block_of_.assign(static_cast<size_t>(group_.size()), -1);
  for (int d = 0; d < group_.size(); ++d) {
    int& slot = block_of_[static_cast<size_t>(all[2 * d] * local + all[2 * d + 1])];
    if (slot != -1) {
      return absl::InvalidArgumentError(
          "quantized gradients: the node groups do not partition "
          "the data-parallel group");
    }
    slot = d;
  }
  return absl::OkStatus();
}

Status QuantizedReduceScatter::Level(Communicator& peers, const std::vector<const float*>& chunk,
                                     const QgzPlan::Level& level, float* acc, Stream* stream) {
  const int size = peers.size(), me = peers.rank();
  if (level.peers <= 1) return absl::OkStatus();
  if (level.peers != size) {
    return absl::InternalError(
        StrCat("qgZ: a level planned for ", level.peers, " ranks runs on ", size));
  }
  const Device device = memory_.device();
  const int64_t n = level.numel, bytes = level.bytes;
  ZR_ASSIGN_OR_RETURN(Buffer out, memory_.Allocate(bytes, MemoryCategory::kCommBuffers, stream));
  ZR_ASSIGN_OR_RETURN(Buffer in, memory_.Allocate(bytes, MemoryCategory::kCommBuffers, stream));
  ZR_ASSIGN_OR_RETURN(Buffer values, memory_.Allocate(n * 4, MemoryCategory::kCommBuffers, stream));
  const TensorView received(values.data(), DType::kF32, {n}, device);
  for (int k = 1; k < size; ++k) {  // a ring: to me + k, from me - k
    const int to = (me + k) % size, from = (me - k + size) % size;
    ZR_RETURN_IF_ERROR(QuantizeInt8(
        TensorView(const_cast<float*>(chunk[static_cast<size_t>(to)]), DType::kF32, {n}, device),
        out.data(), stream));
    ZR_RETURN_IF_ERROR(peers.p2p().SendRecv(out.data(), static_cast<size_t>(bytes), to, in.data(),
                                            static_cast<size_t>(bytes), from, DType::kU8, stream));
    ZR_RETURN_IF_ERROR(DequantizeInt8(in.data(), received, stream));
    ZR_RETURN_IF_ERROR(AccumulateInto(received, TensorView(acc, DType::kF32, {n}, device), stream));
  }
  return absl::OkStatus();
}

Status QuantizedReduceScatter::Run(const float* in, float* out, int64_t count, ReduceOp op,
                                   Stream* stream) {
  if (block_of_.empty()) ZR_RETURN_IF_ERROR(MapRanks());
  const int nodes = inter_ != nullptr ? inter_->size() : 1, local = intra_.size();
  const int node = inter_ != nullptr ? inter_->rank() : 0, me = intra_.rank();
  const Device device = memory_.device();
  const size_t block_bytes = static_cast<size_t>(count) * sizeof(float);
  const QgzPlan plan = PlanQgz(count, nodes, local);  // [Note: the reduce plan]
  // Level 1's chunks: for local index l', the blocks (n', l') for n' = 0..N-1, contiguous.
  ZR_ASSIGN_OR_RETURN(Buffer packed, memory_.Allocate(plan.packed * sizeof(float),
                                                      MemoryCategory::kCommBuffers, stream));
  std::vector<const float*> chunks;
  for (int l = 0; l < local; ++l) {
    for (int n = 0; n < nodes; ++n) {
      const int owner = block_of_[static_cast<size_t>(n * local + l)];
      ZR_RETURN_IF_ERROR(CopyBytes(packed.as<char>() + (l * nodes + n) * block_bytes, device,
                                   reinterpret_cast<const char*>(in) + owner * block_bytes, device,
                                   block_bytes, stream));
    }
    chunks.push_back(packed.as<float>() + static_cast<int64_t>(l) * nodes * count);
  }
  // This rank's own chunk starts the sum, exactly; the others arrive quantized.
  ZR_ASSIGN_OR_RETURN(Buffer partial, memory_.Allocate(plan.partial * sizeof(float),
                                                       MemoryCategory::kCommBuffers, stream));
  ZR_RETURN_IF_ERROR(CopyBytes(partial.data(), device, chunks[static_cast<size_t>(me)], device,
                               block_bytes * nodes, stream));
  intra_.recorder().SetLabel("reduce-scatter (qgZ) in the node");
  ZR_RETURN_IF_ERROR(Level(intra_, chunks, plan.intra, partial.as<float>(), stream));
  intra_.recorder().SetLabel("");
  // Level 2: the node-partial sum of block (n', me) to inter peer n'; this rank's own exactly.
  ZR_RETURN_IF_ERROR(
      CopyBytes(out, device, partial.as<char>() + node * block_bytes, device, block_bytes, stream));
  if (inter_ != nullptr) {
    std::vector<const float*> sums;
    for (int n = 0; n < nodes; ++n) sums.push_back(partial.as<float>() + n * count);
    inter_->recorder().SetLabel("reduce-scatter (qgZ) across nodes");
    ZR_RETURN_IF_ERROR(Level(*inter_, sums, plan.inter, out, stream));
    inter_->recorder().SetLabel("");
  }
  if (op == ReduceOp::kAvg) {
    ZR_RETURN_IF_ERROR(Scale(TensorView(out, DType::kF32, {count}, device),
                             1.0f / static_cast<float>(group_.size()), stream));
  }
  return absl::OkStatus();
}

}  // namespace zerort
