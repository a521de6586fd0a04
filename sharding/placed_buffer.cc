// PlacedBuffer: a planned buffer in memory or on NVMe.
#include "zerort/sharding/placed_buffer.h"

#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<PlacedBuffer> PlacedBuffer::Allocate(const PlannedBuffer& plan, const Tiers& tiers,
                                              Stream* stream) {
  PlacedBuffer b;
  b.tier_ = plan.tier;
  b.dtype_ = plan.dtype;
  b.numel_ = plan.numel;
  if (plan.tier == MemoryTier::kNvme) {
    if (tiers.nvme == nullptr)
      return absl::InternalError("an NVMe placement without an NVMe store");
    ZR_ASSIGN_OR_RETURN(b.region_, tiers.nvme->Reserve(plan.bytes(), plan.category));
    return b;
  }
  Allocator* a = plan.tier == MemoryTier::kDevice ? tiers.device : tiers.host;
  if (a == nullptr) {
    return absl::InternalError(StrCat("no allocator for the ", MemoryTierName(plan.tier), " tier"));
  }
  ZR_ASSIGN_OR_RETURN(b.memory_,
                      a->Allocate(static_cast<size_t>(plan.bytes()), plan.category, stream));
  // Zeroed in the order of the stream it is allocated for (a block it frees may still be in use
  // there); host tiers at once.
  ZR_RETURN_IF_ERROR(FillZero(b.memory_.data(), a->device(), b.memory_.bytes(),
                              plan.tier == MemoryTier::kDevice ? stream : nullptr));
  return b;
}

TensorView PlacedBuffer::View() const {
  ZR_CHECK(in_memory() && memory_) << "view of a buffer on the nvme tier";
  return TensorView(memory_.data(), dtype_, {numel_}, memory_.device());
}

void PlacedBuffer::Reset() {
  memory_.Reset();
  region_ = NvmeRegion();
  numel_ = 0;
}

}  // namespace zerort
