// Buffer, HostAllocator and the stream-aware CachingAllocator.
#include "zerort/runtime/allocator.h"

#include <cstdlib>

#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {

// ---------------------------------------------------------------- Buffer / Allocator

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Buffer::Reset() {
  if (owner_ == nullptr) return;
  owner_->Release(data_, bytes_, category_, handle_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  handle_ = nullptr;
}

MemoryTier Buffer::tier() const {
  ZR_CHECK(owner_ != nullptr) << "tier() of an empty Buffer";
  return owner_->tier();
}

Device Buffer::device() const {
  ZR_CHECK(owner_ != nullptr) << "device() of an empty Buffer";
  return owner_->device();
}

TensorView Buffer::View(DType dtype, Shape shape) const {
  const size_t need = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  ZR_CHECK(need <= bytes_) << "view of " << need << " bytes on a buffer of " << bytes_;
  return TensorView(data_, dtype, std::move(shape), device());
}

Buffer Allocator::MakeBuffer(void* data, size_t bytes, MemoryCategory category, void* handle) {
  Buffer buffer;
  buffer.owner_ = this;
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  buffer.category_ = category;
  buffer.handle_ = handle;
  return buffer;
}

// ---------------------------------------------------------------- HostAllocator

namespace {

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

StatusOr<Buffer> HostAllocator::Allocate(size_t bytes, MemoryCategory category, Stream*) {
  const size_t size = RoundUp(std::max<size_t>(bytes, 1), options_.alignment);
  void* ptr = std::aligned_alloc(options_.alignment, size);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(StrCat("aligned_alloc(", options_.alignment, ", ", size,
                                               ") failed for ", MemoryCategoryName(category)));
  }
  if (options_.tracker != nullptr) {
    options_.tracker->OnAllocate(options_.tier, category, static_cast<int64_t>(bytes));
    options_.tracker->OnReserve(options_.tier, static_cast<int64_t>(size));
  }
  return MakeBuffer(ptr, bytes, category, reinterpret_cast<void*>(size));
}

void HostAllocator::Release(void* data, size_t bytes, MemoryCategory category, void* handle) {
  std::free(data);
  if (options_.tracker != nullptr) {
    options_.tracker->OnFree(options_.tier, category, static_cast<int64_t>(bytes));
    options_.tracker->OnReserve(options_.tier,
                                -static_cast<int64_t>(reinterpret_cast<size_t>(handle)));
  }
}

// ---------------------------------------------------------------- CachingAllocator

struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;           // rounded
  Stream* stream = nullptr;  // the stream it was allocated for; it is reused only there
  bool small = false;
  enum class State { kFree, kAllocated, kPending } state = State::kFree;
  int pending_events = 0;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<Stream*> stream_uses;
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<Stream*>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<char*>()(a->ptr, b->ptr);
}

CachingAllocator::CachingAllocator(std::unique_ptr<CachingBackend> backend,
                                   CachingAllocatorOptions options)
    : backend_(std::move(backend)), options_(options) {
  ZR_CHECK(backend_ != nullptr);
  ZR_CHECK(options_.round_bytes > 0 && options_.small_limit <= options_.small_segment_bytes);
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mu_);
  if (live_blocks_ != 0) {
    Logger()->error("{} allocator destroyed with {} buffers still in use; their memory is leaked",
                    backend_->name(), live_blocks_);
    return;
  }
  const Status status = ReleaseCachedSegments();
  if (!status.ok()) Logger()->error("releasing cached memory: {}", status.message());
}

CachingAllocator::Pool& CachingAllocator::PoolFor(size_t rounded_bytes) {
  return rounded_bytes <= options_.small_limit ? small_pool_ : large_pool_;
}

CachingAllocator::Block* CachingAllocator::TakeFree(Pool& pool, Stream* stream,
                                                    size_t rounded_bytes) {
  Block key;
  key.stream = stream;
  key.size = rounded_bytes;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

StatusOr<CachingAllocator::Block*> CachingAllocator::MapSegment(Pool& pool, Stream* stream,
                                                                size_t rounded_bytes) {
  const bool small = &pool == &small_pool_;
  const size_t size =
      small ? options_.small_segment_bytes : RoundUp(rounded_bytes, options_.large_segment_round);
  StatusOr<void*> ptr = backend_->Map(size);
  if (!ptr.ok()) {
    // Return what the cache holds and try once more before reporting the failure.
    ZR_RETURN_IF_ERROR(ReleaseCachedSegments());
    ptr = backend_->Map(size);
    if (!ptr.ok()) return ptr.status();
  }
  auto* block = new Block;
  block->ptr = static_cast<char*>(*ptr);
  block->size = size;
  block->stream = stream;
  block->small = small;
  ++stats_.segments_mapped;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  if (options_.tracker != nullptr)
    options_.tracker->OnReserve(options_.tier, static_cast<int64_t>(size));
  return block;
}

void CachingAllocator::Split(Pool& pool, Block* block, size_t rounded_bytes) {
  const size_t rest = block->size - rounded_bytes;
  const bool worth_it = block->small ? rest >= options_.round_bytes : rest > options_.small_limit;
  if (!worth_it) return;
  auto* remainder = new Block;
  remainder->ptr = block->ptr + rounded_bytes;
  remainder->size = rest;
  remainder->stream = block->stream;
  remainder->small = block->small;
  remainder->prev = block;
  remainder->next = block->next;
  if (block->next != nullptr) block->next->prev = remainder;
  block->next = remainder;
  block->size = rounded_bytes;
  pool.insert(remainder);
}

StatusOr<Buffer> CachingAllocator::Allocate(size_t bytes, MemoryCategory category, Stream* stream) {
  if (stream != nullptr && stream->device() != backend_->device() &&
      !(stream->device().is_cuda() && backend_->device().is_cpu())) {
    return absl::InvalidArgumentError(StrCat("allocation on ", backend_->device().ToString(),
                                             " for a stream of ", stream->device().ToString()));
  }
  std::lock_guard lock(mu_);
  ProcessPendingEvents();
  const size_t rounded = RoundUp(std::max<size_t>(bytes, 1), options_.round_bytes);
  Pool& pool = PoolFor(rounded);
  Block* block = TakeFree(pool, stream, rounded);
  if (block == nullptr) {
    StatusOr<Block*> mapped = MapSegment(pool, stream, rounded);
    if (!mapped.ok()) {
      std::string report =
          options_.tracker != nullptr ? "\n" + options_.tracker->Report() : std::string();
      return absl::ResourceExhaustedError(fmt::sprintf(
          "out of memory on %s: %s of %d bytes for %s failed (%s); this allocator holds %d "
          "bytes, %d in blocks in use%s",
          backend_->device().ToString(), backend_->name(), rounded, MemoryCategoryName(category),
          ToStd(mapped.status().message()), stats_.reserved_bytes, stats_.allocated_bytes, report));
    }
    block = *mapped;
  }
  Split(pool, block, rounded);
  block->state = Block::State::kAllocated;
  stats_.allocated_bytes += static_cast<int64_t>(block->size);
  ++live_blocks_;
  if (options_.tracker != nullptr) {
    options_.tracker->OnAllocate(options_.tier, category, static_cast<int64_t>(bytes));
  }
  return MakeBuffer(block->ptr, bytes, category, block);
}

Status CachingAllocator::RecordStream(const Buffer& buffer, Stream& stream) {
  std::lock_guard lock(mu_);
  auto* block = static_cast<Block*>(HandleOf(buffer));
  ZR_CHECK(block != nullptr && block->state == Block::State::kAllocated)
      << "RecordStream on a buffer this allocator does not hold";
  if (&stream == block->stream) return absl::OkStatus();
  for (Stream* s : block->stream_uses) {
    if (s == &stream) return absl::OkStatus();
  }
  block->stream_uses.push_back(&stream);
  return absl::OkStatus();
}

void CachingAllocator::Release(void* data, size_t bytes, MemoryCategory category, void* handle) {
  std::lock_guard lock(mu_);
  auto* block = static_cast<Block*>(handle);
  ZR_CHECK(block->state == Block::State::kAllocated && block->ptr == data)
      << "double free or foreign pointer";
  if (options_.tracker != nullptr) {
    options_.tracker->OnFree(options_.tier, category, static_cast<int64_t>(bytes));
  }
  stats_.allocated_bytes -= static_cast<int64_t>(block->size);
  --live_blocks_;
  std::vector<Stream*> uses = std::move(block->stream_uses);
  block->stream_uses.clear();
  for (Stream* s : uses) {
    StatusOr<std::unique_ptr<Event>> event = backend_->NewEvent();
    Status recorded = event.ok() ? (*event)->Record(*s) : event.status();
    if (!recorded.ok()) {
      // Without an event the only safe reuse point is after the whole device is idle.
      Logger()->warn("RecordStream event failed ({}); synchronising the device before reuse",
                     recorded.ToString());
      ZR_CHECK_OK(backend_->SynchronizeDevice());
      continue;
    }
    pending_.emplace_back(std::move(*event), block);
    ++block->pending_events;
  }
  if (block->pending_events > 0) {
    block->state = Block::State::kPending;
    ++stats_.pending_blocks;
    return;
  }
  ReturnToPool(block);
}

void CachingAllocator::ReturnToPool(Block* block) {
  block->state = Block::State::kFree;
  Pool& pool = block->small ? small_pool_ : large_pool_;
  // Merge with free neighbours of the same segment so large requests can reuse the space.
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->state != Block::State::kFree) continue;
    pool.erase(neighbour);
    if (neighbour == block->prev) {
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    delete neighbour;
  }
  pool.insert(block);
}

void CachingAllocator::ProcessPendingEvents() {
  for (size_t i = 0; i < pending_.size();) {
    StatusOr<bool> done = pending_[i].first->Query();
    if (!done.ok() || !*done) {
      ++i;
      continue;
    }
    Block* block = pending_[i].second;
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    if (--block->pending_events == 0) {
      --stats_.pending_blocks;
      ReturnToPool(block);
    }
  }
}

Status CachingAllocator::ReleaseCachedSegments() {
  ZR_RETURN_IF_ERROR(backend_->SynchronizeDevice());
  ProcessPendingEvents();
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;  // part of a segment that still has a block in use
      }
      it = pool->erase(it);
      backend_->Unmap(block->ptr, block->size);
      ++stats_.segments_unmapped;
      stats_.reserved_bytes -= static_cast<int64_t>(block->size);
      if (options_.tracker != nullptr) {
        options_.tracker->OnReserve(options_.tier, -static_cast<int64_t>(block->size));
      }
      delete block;
    }
  }
  return absl::OkStatus();
}

Status CachingAllocator::EmptyCache() {
  std::lock_guard lock(mu_);
  return ReleaseCachedSegments();
}

CachingAllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------- host backend

namespace {

class HostBackend final : public CachingBackend {
 public:
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return "aligned_alloc"; }
  StatusOr<void*> Map(size_t bytes) override {
    void* ptr = std::aligned_alloc(4096, RoundUp(bytes, 4096));
    if (ptr == nullptr) return ErrnoError(StrCat("aligned_alloc(4096, ", bytes, ")"), ENOMEM);
    return ptr;
  }
  void Unmap(void* ptr, size_t) override { std::free(ptr); }
  Status SynchronizeDevice() override { return absl::OkStatus(); }
  StatusOr<std::unique_ptr<Event>> NewEvent() override { return CreateEvent(Device::Cpu()); }
};

}  // namespace

std::unique_ptr<Allocator> MakeCpuCachingAllocator(MemoryTracker* tracker, MemoryTier tier) {
  CachingAllocatorOptions options;
  options.tier = tier;
  options.tracker = tracker;
  return std::make_unique<CachingAllocator>(std::make_unique<HostBackend>(), options);
}

}  // namespace zerort
