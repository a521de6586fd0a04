// PlacedBuffer: one planned buffer on its tier — memory (device, pinned host or host: a Buffer)
// or a region of this rank's NVMe file — with its dtype and element count. Allocated zeroed
// (a fresh NVMe region reads as zeros).
#pragma once

#include "zerort/offload/nvme_store.h"
#include "zerort/runtime/allocator.h"
#include "zerort/sharding/unit_plan.h"

namespace zerort {

// Where each tier's bytes come from. `host` serves kPinnedHost or kHost (whichever the run's
// pin_memory chose); `nvme` is null without an NVMe placement. `staging` is pinned host memory
// for the transient copies between the device and the host tiers on a CUDA run (a copy to or
// from pageable memory is synchronous and slower), whatever pin_memory says of the tiers
// themselves; null elsewhere (use `host`).
struct Tiers {
  Allocator* device = nullptr;
  Allocator* host = nullptr;
  NvmeStore* nvme = nullptr;
  Allocator* staging = nullptr;
  Allocator* StagingOrHost() const { return staging != nullptr ? staging : host; }
};

class PlacedBuffer {
 public:
  PlacedBuffer() = default;
  static StatusOr<PlacedBuffer> Allocate(const PlannedBuffer& plan, const Tiers& tiers,
                                         Stream* stream);

  explicit operator bool() const { return numel_ > 0; }
  MemoryTier tier() const { return tier_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(DTypeSize(dtype_)); }
  bool in_memory() const { return tier_ != MemoryTier::kNvme; }
  // The whole buffer (in memory only).
  TensorView View() const;
  const NvmeRegion& region() const { return region_; }  // kNvme only
  Buffer& memory() { return memory_; }
  void Reset();

 private:
  Buffer memory_;
  NvmeRegion region_;
  MemoryTier tier_ = MemoryTier::kDevice;
  DType dtype_ = DType::kF32;
  int64_t numel_ = 0;
};

}  // namespace zerort
