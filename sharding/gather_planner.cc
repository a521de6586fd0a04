#include "zerort/sharding/gather_planner.h"

#include "zerort/runtime/status.h"
#include "zerort/sharding/reuse_distance.h"

namespace zerort {

GatherBudgets GatherBudgets::From(const ShardManagerOptions& o) {
  return GatherBudgets{o.stage3_max_live_parameters, o.stage3_prefetch_bucket_size,
                       o.stage3_max_reuse_distance};
}

GatherPlanner::GatherPlanner(GatherBudgets budgets, std::vector<UnitInfo> units)
    : budgets_(budgets),
      units_(std::move(units)),
      use_position_(units_.size(), 0),
      kept_(units_.size(), 0),
      is_candidate_(units_.size(), 0) {}

void GatherPlanner::AddCandidate(int unit) const {
  if (units_[static_cast<size_t>(unit)].persistent || is_candidate_[static_cast<size_t>(unit)]) {
    return;
  }
  is_candidate_[static_cast<size_t>(unit)] = 1;
  candidates_.push_back(unit);
}

bool GatherPlanner::BeginUse(int unit) {
  ZR_CHECK(unit >= 0 && static_cast<size_t>(unit) < units_.size())
      << "unit " << unit << " of " << units_.size();
  bool followed = true;
  use_position_[unit] = position_;
  kept_[unit] = 0;
  AddCandidate(unit);
  if (recording_) {
    order_.push_back(unit);
  } else if (!order_changed_ && (position_ >= order_.size() || order_[position_] != unit)) {
    order_changed_ = true;  // a branch, say: no prefetch or keeps this step; record the next
    followed = false;
  }
  ++position_;
  return followed;
}

int64_t GatherPlanner::LiveNumel(const Resident& resident) const {
  int64_t numel = 0;
  for (size_t i = 0; i < candidates_.size();) {
    const int u = candidates_[i];
    if (resident(u)) {
      numel += units_[static_cast<size_t>(u)].numel;
      ++i;
    } else {  // released since: no longer a candidate
      is_candidate_[static_cast<size_t>(u)] = 0;
      candidates_[i] = candidates_.back();
      candidates_.pop_back();
    }
  }
  return numel;
}

std::span<const int> GatherPlanner::Upcoming() const {
  if (!replaying() || position_ >= order_.size()) return {};
  return std::span<const int>(order_).subspan(position_);
}

std::vector<int> GatherPlanner::Prefetch(const Resident& resident) const {
  std::vector<int> picked;
  if (!replaying() || position_ >= order_.size()) return picked;
  int64_t live = LiveNumel(resident);
  int64_t ahead = 0;
  for (size_t p = next_gathered_[position_]; p < order_.size(); p = next_gathered_[p + 1]) {
    const int u = order_[p];
    const UnitInfo& info = units_[u];
    if (resident(u)) continue;
    bool already = false;  // a unit recorded twice ahead is gathered once
    for (int q : picked) already = already || q == u;
    if (already) continue;
    if (ahead + info.numel > budgets_.prefetch_numel ||
        live + info.numel > budgets_.max_live_numel) {
      break;
    }
    picked.push_back(u);
    AddCandidate(u);
    ahead += info.numel;
    live += info.numel;
  }
  return picked;
}

bool GatherPlanner::EndUse(int unit, const Resident& resident) {
  const UnitInfo& info = units_.at(static_cast<size_t>(unit));
  if (info.persistent || !replaying() ||
      !KeepsGathered(reuse_distances_, use_position_[unit], budgets_.max_reuse_distance)) {
    return false;
  }
  // Within the live budget together with the unit used next (gathered then on demand).
  int64_t next = 0;
  if (position_ < order_.size()) {
    const int n = order_[position_];
    if (!units_[n].persistent && !resident(n)) next = units_[n].numel;
  }
  if (LiveNumel(resident) + next > budgets_.max_live_numel) return false;
  kept_[unit] = 1;
  return true;
}

std::vector<int> GatherPlanner::TakeKept() {
  std::vector<int> kept;
  for (size_t u = 0; u < kept_.size(); ++u) {
    if (kept_[u]) kept.push_back(static_cast<int>(u));
    kept_[u] = 0;
  }
  return kept;
}

void GatherPlanner::EndStep() {
  if (order_changed_) {
    order_.clear();
    recording_ = true;
    order_changed_ = false;
  } else {
    if (recording_) {
      std::vector<int64_t> numel;
      for (const UnitInfo& u : units_) numel.push_back(u.persistent ? 0 : u.numel);
      reuse_distances_ = ReuseDistances(order_, numel);
      next_gathered_.assign(order_.size() + 1, order_.size());
      for (size_t p = order_.size(); p-- > 0;) {
        next_gathered_[p] =
            units_[static_cast<size_t>(order_[p])].persistent ? next_gathered_[p + 1] : p;
      }
    }
    recording_ = false;
  }
  position_ = 0;
}

}  // namespace zerort
