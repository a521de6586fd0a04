// Which stage-3 units to gather ahead and which to keep gathered: the decisions ShardManager
// executes and the memory model (estimate/step_model.cc) replays, so that the two cannot drift.
//
// [Note: the gather plan] A step uses units in an order (forward, then backward, per micro-batch).
// The first step records it (no prefetch, no keeps); later steps replay it. At each use the
// planner names the units to all-gather ahead of need: the next ones of the record that are not
// already gathered, as long as the elements issued ahead stay within `prefetch_numel`
// (stage3_prefetch_bucket_size) and the elements of every gathered-or-gathering unit within
// `max_live_numel` (stage3_max_live_parameters). At the end of each use it decides whether the
// unit stays gathered: its next use comes within `max_reuse_distance` elements of other units
// (reuse_distance.h) and the gathered units and the unit used next fit `max_live_numel`. A kept
// unit is released at the end of its next use (unless kept again) or at the step. A use that
// differs from the record stops prefetch and keeps for the rest of the step; the next step
// records again. Persistent units are never gathered or released: the planner ignores them.
//
// The planner owns the order and the decisions, not the buffers: the executor says which units
// are resident (gathering or gathered) and performs the gathers and releases. Its cost per use is
// O(units resident at once), not O(units), and the record's reuse distances O(n log n): a model
// of 65,536 blocks plans as fast per block as one of 12. It counts padded
// elements, as DeepSpeed's keys do (a unit's gathered bytes are these times the compute dtype's
// size, the same factor for every unit).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zerort/sharding/options.h"

namespace zerort {

struct GatherBudgets {             // elements
  int64_t max_live_numel = 0;      // stage3_max_live_parameters
  int64_t prefetch_numel = 0;      // stage3_prefetch_bucket_size
  int64_t max_reuse_distance = 0;  // stage3_max_reuse_distance; 0 never keeps
  static GatherBudgets From(const ShardManagerOptions& o);
};

class GatherPlanner {
 public:
  struct UnitInfo {
    int64_t numel = 0;        // the gathered buffer's padded elements
    bool persistent = false;  // always gathered (stages 0-2, or below the threshold)
  };
  // Whether a unit's gathered weights exist (gathering or gathered): the executor's state.
  using Resident = std::function<bool(int unit)>;

  GatherPlanner(GatherBudgets budgets, std::vector<UnitInfo> units);

  // A use of `unit` begins (before its own gather completes): recorded in a recording step,
  // checked against the record in a replayed one. Returns false when this use left the record.
  bool BeginUse(int unit);
  // After the current use's gather: the units to gather ahead, in order (none unless replaying).
  std::vector<int> Prefetch(const Resident& resident) const;
  // The record after the current use (NVMe fetches run ahead over it); empty unless replaying.
  std::span<const int> Upcoming() const;
  // The current use of `unit` ends: true when it stays gathered (then remembered as kept).
  bool EndUse(int unit, const Resident& resident);
  // At the step: the units kept gathered for a use that did not come, to release now.
  std::vector<int> TakeKept();
  // The step's order ends: a recorded order becomes the record; a changed one records again.
  void EndStep();

  bool replaying() const { return !recording_ && !order_changed_; }
  // Elements of every non-persistent resident unit. A unit becomes resident only through a use
  // (BeginUse) or a prefetch (Prefetch), so only the units those named, and not yet seen released,
  // are asked: O(live units), not O(units) ([Note: the gather plan]'s cost).
  int64_t LiveNumel(const Resident& resident) const;

 private:
  GatherBudgets budgets_;
  std::vector<UnitInfo> units_;
  std::vector<int> order_;  // the record (while recording: the uses so far)
  bool recording_ = true;
  bool order_changed_ = false;
  size_t position_ = 0;                   // index into order_ of the next use this step
  std::vector<int64_t> reuse_distances_;  // per position of order_
  std::vector<size_t> use_position_;      // per unit: the position of its current use
  std::vector<char> kept_;                // per unit: its last use ended kept gathered
  // Per position of the record: the next position at or after it whose unit is not persistent
  // (order_.size() if none), so that Prefetch's walk skips persistent units in O(1).
  std::vector<size_t> next_gathered_;
  // Units a use or a prefetch named that may still be resident (each once; pruned by LiveNumel
  // when the executor has released them).
  mutable std::vector<int> candidates_;
  mutable std::vector<char> is_candidate_;
  void AddCandidate(int unit) const;
};

}  // namespace zerort
