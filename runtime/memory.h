// Memory accounting: every allocation carries a category and lives on a tier; a MemoryTracker
// keeps current and peak bytes per (tier, category), the peak of each tier's total in use, and
// the bytes each tier's allocators hold from the system (reserved: in use + cached + rounding).
// "In use" counts the bytes callers asked for, so it is what the estimator predicts; reserved
// minus in use is the allocator's overhead. All counts are exact; the tracker is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace zerort {

// value rounded up to a multiple of `multiple` (> 0): sizes padded to an alignment.
inline constexpr int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

enum class MemoryCategory : uint8_t {
  kParameters,       // master and compute shards, full parameters at stages 0-2
  kGradients,        // full gradients and gradient shards
  kOptimizerState,   // exp_avg, exp_avg_sq, momentum
  kGatheredWeights,  // all-gathered units and their prefetch
  kActivations,      // saved activations of forward for backward
  kCommBuffers,      // reduce buckets, staging for collectives
  kWorkspace,        // scratch of kernels (GEMM workspace, reductions)
  kStaging,          // offload staging: host buffers that NVMe and device copies pass through
};
inline constexpr int kNumMemoryCategories = 8;

enum class MemoryTier : uint8_t {
  kDevice,      // where compute runs: GPU memory, or host memory on a CPU run
  kPinnedHost,  // page-locked host memory (offload, staging)
  kHost,        // ordinary host memory
  kNvme,        // files of the NVMe offload tier
};
inline constexpr int kNumMemoryTiers = 4;

std::string_view MemoryCategoryName(MemoryCategory category);  // "parameters", ...
std::string_view MemoryTierName(MemoryTier tier);              // "device", "pinned_host", ...

struct MemoryUsage {
  int64_t current = 0;
  int64_t peak = 0;
};

struct MemorySnapshot {
  std::array<std::array<MemoryUsage, kNumMemoryCategories>, kNumMemoryTiers> by_category{};
  std::array<MemoryUsage, kNumMemoryTiers> in_use{};    // sum over categories; peak of the sum
  std::array<MemoryUsage, kNumMemoryTiers> reserved{};  // held from the system by allocators

  const MemoryUsage& Get(MemoryTier tier, MemoryCategory category) const {
    return by_category[static_cast<int>(tier)][static_cast<int>(category)];
  }
};

class MemoryTracker {
 public:
  void OnAllocate(MemoryTier tier, MemoryCategory category, int64_t bytes);
  void OnFree(MemoryTier tier, MemoryCategory category, int64_t bytes);
  // Allocator-held bytes changed by `delta` (a segment was mapped or returned to the system).
  void OnReserve(MemoryTier tier, int64_t delta);

  MemoryUsage Usage(MemoryTier tier, MemoryCategory category) const;
  MemoryUsage InUse(MemoryTier tier) const;
  MemoryUsage Reserved(MemoryTier tier) const;
  MemorySnapshot Snapshot() const;
  // Peaks restart from the current values (e.g. at the start of a measured step).
  void ResetPeaks();
  // A human-readable table of the non-zero rows.
  std::string Report() const;

 private:
  mutable std::mutex mu_;
  MemorySnapshot state_;
};

}  // namespace zerort
