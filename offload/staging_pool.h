// StagingPool: a fixed set of equal host buffers (pinned when the allocator pins, each
// 4 KiB-aligned for O_DIRECT) that NVMe reads and writes and device copies pass through. A buffer
// is leased, filled or drained, and returned together with the work still using it (I/O handles,
// copies, events: "fences"); it is leased again only after every fence has finished, so a buffer
// is never reused while a copy still reads it. Leases go round in return order (FIFO), which is
// what double buffering needs. Accounted as kStaging on the allocator's tier.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "zerort/runtime/allocator.h"

namespace zerort {

// One 4 KiB-aligned host buffer of at least `bytes` (rounded up to 4 KiB), for an O_DIRECT
// transfer outside a pool (initial values, checkpoint state). Accounted as kStaging.
struct AlignedHostBuffer {
  Buffer memory;
  char* data = nullptr;
};
StatusOr<AlignedHostBuffer> AllocateAligned(Allocator& host, int64_t bytes);
// The bytes AllocateAligned asks its allocator for (for the memory model).
int64_t AlignedAllocationBytes(int64_t bytes);

// Something to wait for before a staging buffer is reused.
using Fence = std::function<Status()>;

class StagingPool {
 public:
  struct Lease {
    int slot = -1;
    void* data = nullptr;
    size_t bytes = 0;  // the buffer's size (the pool's buffer size)
    explicit operator bool() const { return slot >= 0; }
  };

  // `count` buffers of `bytes` each (rounded up to 4 KiB), from one allocation on `host`.
  static StatusOr<std::unique_ptr<StagingPool>> Create(Allocator& host, int count, size_t bytes);
  // The bytes Create asks its allocator for (for the memory model).
  static int64_t AllocationBytes(int count, size_t bytes);

  // The buffer returned longest ago, once its fences have finished (their first failure is
  // returned, and the buffer stays usable). ZR_CHECK: a lease is available (callers hold at
  // most count() at once).
  StatusOr<Lease> Acquire();
  // Gives the lease back; `fences` are waited for before the buffer is leased again.
  void Return(Lease lease, std::vector<Fence> fences = {});
  // Waits for every returned buffer's fences (before the memory they point to goes away).
  Status Drain();

  int count() const { return static_cast<int>(slots_.size()); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  int available() const { return static_cast<int>(free_.size()); }

 private:
  StagingPool() = default;
  struct Slot {
    void* data = nullptr;
    std::vector<Fence> fences;
  };
  Buffer memory_;
  size_t buffer_bytes_ = 0;
  std::vector<Slot> slots_;
  std::deque<int> free_;  // in return order
};

}  // namespace zerort
