// MemoryTracker: exact per-category and per-tier byte counts.
#include "zerort/runtime/memory.h"

#include <algorithm>

#include "zerort/runtime/status.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

void Add(MemoryUsage& usage, int64_t delta) {
  usage.current += delta;
  ZR_CHECK(usage.current >= 0) << "memory accounting went negative (" << usage.current << ")";
  usage.peak = std::max(usage.peak, usage.current);
}

}  // namespace

std::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer_state";
    case MemoryCategory::kGatheredWeights:
      return "gathered_weights";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kCommBuffers:
      return "comm_buffers";
    case MemoryCategory::kWorkspace:
      return "workspace";
    case MemoryCategory::kStaging:
      return "staging";
  }
  return "invalid";
}

std::string_view MemoryTierName(MemoryTier tier) {
  switch (tier) {
    case MemoryTier::kDevice:
      return "device";
    case MemoryTier::kPinnedHost:
      return "pinned_host";
    case MemoryTier::kHost:
      return "host";
    case MemoryTier::kNvme:
      return "nvme";
  }
  return "invalid";
}

void MemoryTracker::OnAllocate(MemoryTier tier, MemoryCategory category, int64_t bytes) {
  std::lock_guard lock(mu_);
  Add(state_.by_category[static_cast<int>(tier)][static_cast<int>(category)], bytes);
  Add(state_.in_use[static_cast<int>(tier)], bytes);
}

void MemoryTracker::OnFree(MemoryTier tier, MemoryCategory category, int64_t bytes) {
  std::lock_guard lock(mu_);
  Add(state_.by_category[static_cast<int>(tier)][static_cast<int>(category)], -bytes);
  Add(state_.in_use[static_cast<int>(tier)], -bytes);
}

void MemoryTracker::OnReserve(MemoryTier tier, int64_t delta) {
  std::lock_guard lock(mu_);
  Add(state_.reserved[static_cast<int>(tier)], delta);
}

MemoryUsage MemoryTracker::Usage(MemoryTier tier, MemoryCategory category) const {
  std::lock_guard lock(mu_);
  return state_.Get(tier, category);
}

MemoryUsage MemoryTracker::InUse(MemoryTier tier) const {
  std::lock_guard lock(mu_);
  return state_.in_use[static_cast<int>(tier)];
}

MemoryUsage MemoryTracker::Reserved(MemoryTier tier) const {
  std::lock_guard lock(mu_);
  return state_.reserved[static_cast<int>(tier)];
}

MemorySnapshot MemoryTracker::Snapshot() const {
  std::lock_guard lock(mu_);
  return state_;
}

void MemoryTracker::ResetPeaks() {
  std::lock_guard lock(mu_);
  for (auto& tier : state_.by_category) {
    for (auto& usage : tier) usage.peak = usage.current;
  }
  for (auto& usage : state_.in_use) usage.peak = usage.current;
  for (auto& usage : state_.reserved) usage.peak = usage.current;
}

std::string MemoryTracker::Report() const {
  const MemorySnapshot s = Snapshot();
  std::string out = fmt::sprintf("%-12s %-17s %14s %14s\n", "tier", "category", "current", "peak");
  for (int t = 0; t < kNumMemoryTiers; ++t) {
    const auto tier = static_cast<MemoryTier>(t);
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      const MemoryUsage& u = s.by_category[t][c];
      if (u.peak == 0) continue;
      out += fmt::sprintf("%-12s %-17s %14d %14d\n", MemoryTierName(tier),
                          MemoryCategoryName(static_cast<MemoryCategory>(c)), u.current, u.peak);
    }
    if (s.in_use[t].peak != 0 || s.reserved[t].peak != 0) {
      out += fmt::sprintf("%-12s %-17s %14d %14d\n", MemoryTierName(tier), "(in use)",
                          s.in_use[t].current, s.in_use[t].peak);
      out += fmt::sprintf("%-12s %-17s %14d %14d\n", MemoryTierName(tier), "(reserved)",
                          s.reserved[t].current, s.reserved[t].peak);
    }
  }
  return out;
}

}  // namespace zerort
