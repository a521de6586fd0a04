// The memory model's allocation replay (internal to estimate/): allocations and frees through the
// runtime's own CachingAllocator over a backend that maps address space and no memory, into a
// MemoryTracker, so in-use and reserved peaks (allocator overhead included) mean what they mean in
// a real run. step_model.cc drives it in the runtime's program order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/memory.h"

namespace zerort {

// A caching-allocator backend that hands out address space and no memory: the replay runs the
// runtime's own CachingAllocator (rounding, segments, per-stream pools, split and merge) over it,
// so reserved bytes (allocator overhead) are predicted by the same policy code that makes them.
class AddressSpaceBackend final : public CachingBackend {
 public:
  Device device() const override { return Device::Cpu(); }
  std::string_view name() const override { return "the memory model's address space"; }
  StatusOr<void*> Map(size_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 4095) / 4096 * 4096;
    return p;
  }
  void Unmap(void*, size_t) override {}
  Status SynchronizeDevice() override { return absl::OkStatus(); }
  StatusOr<std::unique_ptr<Event>> NewEvent() override { return CreateEvent(Device::Cpu()); }

 private:
  uintptr_t next_ = uintptr_t{1} << 30;
};

// The replay: allocations and frees through caching allocators (device, pinned host) into a
// MemoryTracker, NVMe bytes straight into it, with the phase peaks on the side.
class Replay {
 public:
  using Cat = MemoryCategory;
  using Tier = MemoryTier;

  enum Phase { kInit, kForward, kBackward, kStep };

  struct Handle {
    Tier tier = Tier::kDevice;
    Cat cat = Cat::kWorkspace;
    int64_t bytes = 0;
    bool live = false;
    Buffer buffer;  // device and pinned-host tiers
  };

  // `model_states_only` (cold mode): activations and workspace are not replayed.
  explicit Replay(bool model_states_only) : model_states_only_(model_states_only) {
    for (Tier tier : {Tier::kDevice, Tier::kPinnedHost, Tier::kHost}) {
      CachingAllocatorOptions o;  // the defaults, as the CPU and CUDA allocators use them
      o.tier = tier;
      o.tracker = &tracker_;
      allocators_[static_cast<int>(tier)] =
          std::make_unique<CachingAllocator>(std::make_unique<AddressSpaceBackend>(), o);
    }
  }

  Handle Alloc(Cat cat, int64_t bytes, Stream* stream, Tier tier = Tier::kDevice) {
    if (model_states_only_ && (cat == Cat::kActivations || cat == Cat::kWorkspace)) {
      return Handle{tier, cat, bytes, false, Buffer()};
    }
    Handle h{tier, cat, bytes, true, Buffer()};
    if (Allocator* a = allocators_[static_cast<int>(tier)].get()) {
      h.buffer = *a->Allocate(static_cast<size_t>(bytes), cat, stream);
    } else {
      tracker_.OnAllocate(tier, cat, bytes);
    }
    Note();
    return h;
  }
  // The buffer is also used on `stream` (its block is reused only after that stream's work).
  void Use(Handle& h, Stream& stream) {
    if (h.buffer)
      ZR_CHECK_OK(allocators_[static_cast<int>(h.tier)]->RecordStream(h.buffer, stream));
  }
  void Free(Handle& h) {
    if (!h.live) return;
    if (h.buffer) {
      h.buffer.Reset();
    } else {
      tracker_.OnFree(h.tier, h.cat, h.bytes);
    }
    h.live = false;
  }
  void SetPhase(Phase p) { phase_ = p; }
  MemorySnapshot Snapshot() const { return tracker_.Snapshot(); }
  void ResetPeaks() {
    tracker_.ResetPeaks();
    phase_peak_ = {};
  }
  const std::array<std::array<int64_t, kNumMemoryTiers>, 4>& phase_peaks() const {
    return phase_peak_;
  }

 private:
  void Note() {
    const MemorySnapshot s = tracker_.Snapshot();
    for (int t = 0; t < kNumMemoryTiers; ++t) {
      phase_peak_[phase_][t] = std::max(phase_peak_[phase_][t], s.in_use[t].current);
    }
  }
  const bool model_states_only_;
  MemoryTracker tracker_;  // declared first: the allocators report to it until they are gone
  std::array<std::unique_ptr<Allocator>, kNumMemoryTiers> allocators_;
  Phase phase_ = kInit;
  std::array<std::array<int64_t, kNumMemoryTiers>, 4> phase_peak_{};
};

}  // namespace zerort
