// Range: a half-open span [begin, end) of element positions. The shard manager counts them in
// named frames (flat, shard or param; sharding/README.md) and its variables say theirs:
// flat_range, shard_range, param_range. Here, below sharding/, so that kernels take spans of it
// too (HostAccumulateWithSumOfSquares, kernels/reduce.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace zerort {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  Range Intersect(const Range& other) const {
    Range r{std::max(begin, other.begin), std::min(end, other.end)};
    if (r.end < r.begin) r.end = r.begin;
    return r;
  }
  // The same span expressed relative to `origin` (e.g. flat -> shard: Shift(-shard_begin)).
  Range Shift(int64_t delta) const { return Range{begin + delta, end + delta}; }
  std::string ToString() const {
    std::string s = "[";  // appended, not "[" + ...: GCC 12's -Wrestrict misfires on that
    s += std::to_string(begin);
    s += ", ";
    s += std::to_string(end);
    s += ')';
    return s;
  }
  friend bool operator==(const Range&, const Range&) = default;
};

}  // namespace zerort
