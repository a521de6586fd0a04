// DeepSpeed's stage3_max_reuse_distance, as one pure function the shard manager and the memory
// model share (so the estimate replays the runtime's decision).
//
// A step uses units in a recorded order (forward, then backward, per micro-batch). Ending a use
// normally releases a stage-3 unit's gathered weights; when the same unit is used again within
// the step after fewer than `max_reuse_distance` elements of other units have been used (the
// last block: its forward is followed at once by its backward), keeping it gathered saves an
// all-gather for the memory of holding it. The distance of a use is the elements of the distinct
// other units used before its next use; units that are never gathered count 0.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace zerort {

// Per position of `order` (unit indices into `gathered_numel`): the distance to the same unit's
// next use, or -1 when the unit is not used again in `order`.
std::vector<int64_t> ReuseDistances(std::span<const int> order,
                                    std::span<const int64_t> gathered_numel);

// Whether the use at `position` keeps its unit gathered: a next use within the distance
// (strictly less than `max_reuse_distance`; 0 never keeps).
inline bool KeepsGathered(std::span<const int64_t> distances, size_t position,
                          int64_t max_reuse_distance) {
  if (max_reuse_distance <= 0 || position >= distances.size()) return false;
  const int64_t d = distances[position];
  return d >= 0 && d < max_reuse_distance;
}

}  // namespace zerort
