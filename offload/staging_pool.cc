// StagingPool: leases of equal, aligned host buffers, reused only after their fences.
#include "zerort/offload/staging_pool.h"

#include "zerort/runtime/strings.h"

namespace zerort {

namespace {
constexpr size_t kAlign = 4096;
size_t PageRoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

int64_t AlignedAllocationBytes(int64_t bytes) {
  return static_cast<int64_t>(PageRoundUp(static_cast<size_t>(bytes)) + kAlign);
}

StatusOr<AlignedHostBuffer> AllocateAligned(Allocator& host, int64_t bytes) {
  AlignedHostBuffer b;
  ZR_ASSIGN_OR_RETURN(b.memory,
                      host.Allocate(AlignedAllocationBytes(bytes), MemoryCategory::kStaging));
  b.data = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b.memory.data()) + kAlign - 1) /
                                   kAlign * kAlign);
  return b;
}

int64_t StagingPool::AllocationBytes(int count, size_t bytes) {
  return static_cast<int64_t>(PageRoundUp(bytes) * count + kAlign);
}

StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(Allocator& host, int count,
                                                           size_t bytes) {
  if (count < 1 || bytes == 0) {
    return absl::InvalidArgumentError(
        StrCat("staging pool of ", count, " buffers of ", bytes, " bytes"));
  }
  if (host.device() != Device::Cpu()) {
    return absl::InvalidArgumentError("staging buffers must be host memory");
  }
  if (bytes > (size_t{1} << 48) / static_cast<size_t>(count)) {  // 256 TiB: no machine has it
    return absl::InvalidArgumentError(StrCat("staging pool of ", count, " buffers of ", bytes,
                                             " bytes is beyond any host memory"));
  }
  std::unique_ptr<StagingPool> pool(new StagingPool());
  pool->buffer_bytes_ = PageRoundUp(bytes);
  ZR_ASSIGN_OR_RETURN(
      pool->memory_, host.Allocate(pool->buffer_bytes_ * count + kAlign, MemoryCategory::kStaging));
  const uintptr_t base =
      (reinterpret_cast<uintptr_t>(pool->memory_.data()) + kAlign - 1) / kAlign * kAlign;
  for (int i = 0; i < count; ++i) {
    pool->slots_.push_back({reinterpret_cast<void*>(base + i * pool->buffer_bytes_), {}});
    pool->free_.push_back(i);
  }
  return pool;
}

StatusOr<StagingPool::Lease> StagingPool::Acquire() {
  ZR_CHECK(!free_.empty()) << "all " << slots_.size() << " staging buffers are leased";
  const int slot = free_.front();
  free_.pop_front();
  Status first = absl::OkStatus();
  for (Fence& fence : slots_[slot].fences) {
    Status s = fence();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  slots_[slot].fences.clear();
  if (!first.ok()) {
    free_.push_front(slot);
    return first;
  }
  return Lease{slot, slots_[slot].data, buffer_bytes_};
}

void StagingPool::Return(Lease lease, std::vector<Fence> fences) {
  ZR_CHECK(lease.slot >= 0 && lease.slot < count()) << "returning a lease this pool did not give";
  slots_[lease.slot].fences = std::move(fences);
  free_.push_back(lease.slot);
}

Status StagingPool::Drain() {
  Status first = absl::OkStatus();
  for (Slot& slot : slots_) {
    for (Fence& fence : slot.fences) {
      Status s = fence();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    slot.fences.clear();
  }
  return first;
}

}  // namespace zerort
