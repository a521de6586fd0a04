// Allocators. Every allocation is a Buffer (move-only, returns itself to its allocator) tagged
// with a MemoryCategory and accounted in a MemoryTracker on the allocator's tier.
//
// - HostAllocator: aligned ordinary host memory, no caching.
// - CachingAllocator: stream-aware caching over a backend that maps large segments (cudaMalloc,
//   cudaHostAlloc, or aligned host memory on a CPU run). Blocks are carved from segments, freed
//   blocks return to a pool keyed by the stream they were allocated for, and are reused by that
//   stream without synchronisation; a block also used on other streams (RecordStream) is reused
//   only after events recorded on those streams at free time have completed. Nothing is returned
//   to the system per layer: segments are unmapped only by EmptyCache or after an allocation
//   failure, to retry it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "zerort/runtime/device.h"
#include "zerort/runtime/memory.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

class Allocator;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  // Returns the memory to its allocator now.
  void Reset();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  MemoryTier tier() const;
  Device device() const;
  explicit operator bool() const { return owner_ != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // A view of the first NumElements(shape) elements; checks that they fit.
  TensorView View(DType dtype, Shape shape) const;

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
  void* handle_ = nullptr;  // the allocator's record of the block
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual MemoryTier tier() const = 0;
  virtual Device device() const = 0;
  // `stream` is where the buffer will be used first (nullptr: by the host, synchronously).
  virtual StatusOr<Buffer> Allocate(size_t bytes, MemoryCategory category,
                                    Stream* stream = nullptr) = 0;
  // Declares that `buffer` is also used on `stream`, so its memory is not reused before the work
  // issued there up to its release has finished.
  virtual Status RecordStream(const Buffer& buffer, Stream& stream) { return absl::OkStatus(); }
  // Returns cached, unused memory to the system.
  virtual Status EmptyCache() { return absl::OkStatus(); }

 protected:
  friend class Buffer;
  Buffer MakeBuffer(void* data, size_t bytes, MemoryCategory category, void* handle);
  static void* HandleOf(const Buffer& buffer) { return buffer.handle_; }
  virtual void Release(void* data, size_t bytes, MemoryCategory category, void* handle) = 0;
};

// Aligned host memory straight from the C library, accounted on `tier` (kHost by default).
class HostAllocator final : public Allocator {
 public:
  struct Options {
    size_t alignment = 64;  // a cache line; use 4096 for O_DIRECT file I/O
    MemoryTier tier = MemoryTier::kHost;
    MemoryTracker* tracker = nullptr;  // null: no accounting
  };
  explicit HostAllocator(Options options) : options_(options) {}
  MemoryTier tier() const override { return options_.tier; }
  Device device() const override { return Device::Cpu(); }
  StatusOr<Buffer> Allocate(size_t bytes, MemoryCategory category, Stream* stream) override;

 private:
  void Release(void* data, size_t bytes, MemoryCategory category, void* handle) override;
  Options options_;
};

// Where a CachingAllocator gets its segments and events from.
class CachingBackend {
 public:
  virtual ~CachingBackend() = default;
  virtual Device device() const = 0;
  virtual std::string_view name() const = 0;  // the call that maps memory, for messages
  virtual StatusOr<void*> Map(size_t bytes) = 0;
  virtual void Unmap(void* ptr, size_t bytes) = 0;
  // Waits for every stream of the device, before cached memory goes back to the system.
  virtual Status SynchronizeDevice() = 0;
  virtual StatusOr<std::unique_ptr<Event>> NewEvent() = 0;
};

struct CachingAllocatorOptions {
  MemoryTier tier = MemoryTier::kDevice;
  MemoryTracker* tracker = nullptr;              // null: no accounting
  size_t round_bytes = 512;                      // every block is a multiple of this
  size_t small_limit = size_t{1} << 20;          // requests up to this share small segments
  size_t small_segment_bytes = size_t{2} << 20;  // size of a segment for small requests
  size_t large_segment_round = size_t{2} << 20;  // large segments are multiples of this
};

struct CachingAllocatorStats {
  int64_t segments_mapped = 0;    // backend Map calls that succeeded, ever
  int64_t segments_unmapped = 0;  // backend Unmap calls, ever
  int64_t reserved_bytes = 0;     // currently mapped
  int64_t allocated_bytes = 0;    // in blocks handed out (rounded sizes)
  int64_t pending_blocks = 0;     // freed blocks waiting for other streams' events
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(std::unique_ptr<CachingBackend> backend, CachingAllocatorOptions options);
  ~CachingAllocator() override;

  MemoryTier tier() const override { return options_.tier; }
  Device device() const override { return backend_->device(); }
  StatusOr<Buffer> Allocate(size_t bytes, MemoryCategory category, Stream* stream) override;
  Status RecordStream(const Buffer& buffer, Stream& stream) override;
  Status EmptyCache() override;
  CachingAllocatorStats stats() const;

 private:
  struct Block;
  // Hidden: called only inside allocator.cc, where the pools' tree operations can then inline it
  // (an exported function may be interposed, so -fPIC code calls it through the PLT).
  struct BlockOrder {
    __attribute__((visibility("hidden"))) bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  void Release(void* data, size_t bytes, MemoryCategory category, void* handle) override;
  Pool& PoolFor(size_t rounded_bytes);
  Block* TakeFree(Pool& pool, Stream* stream, size_t rounded_bytes);
  StatusOr<Block*> MapSegment(Pool& pool, Stream* stream, size_t rounded_bytes);
  void Split(Pool& pool, Block* block, size_t rounded_bytes);
  void ReturnToPool(Block* block);
  void ProcessPendingEvents();
  Status ReleaseCachedSegments();  // unmaps every segment with no block in use

  std::unique_ptr<CachingBackend> backend_;
  CachingAllocatorOptions options_;
  mutable std::mutex mu_;
  Pool small_pool_;
  Pool large_pool_;
  std::vector<std::pair<std::unique_ptr<Event>, Block*>> pending_;
  CachingAllocatorStats stats_;
  int64_t live_blocks_ = 0;
};

// The device-tier allocator of a CPU run: a CachingAllocator over 4 KiB-aligned host memory.
std::unique_ptr<Allocator> MakeCpuCachingAllocator(MemoryTracker* tracker,
                                                   MemoryTier tier = MemoryTier::kDevice);
// A CachingAllocator over cudaMalloc on `device` (fails in a build or on a machine without CUDA).
StatusOr<std::unique_ptr<Allocator>> MakeCudaCachingAllocator(Device device,
                                                              MemoryTracker* tracker);
// A CachingAllocator over cudaHostAlloc: pinned host memory for copies and staging.
StatusOr<std::unique_ptr<Allocator>> MakePinnedHostAllocator(MemoryTracker* tracker);

}  // namespace zerort
