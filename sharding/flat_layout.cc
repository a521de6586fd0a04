// FlatLayout construction and shard pieces.
#include "sharding/flat_layout.h"

#include <set>

#include "runtime/strings.h"

namespace zerort {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

StatusOr<FlatLayout> FlatLayout::Create(std::vector<ParamSpec> params, int dp_size,
                                        int64_t alignment) {
  if (params.empty()) return absl::InvalidArgumentError("a unit needs at least one parameter");
  if (dp_size < 1) return absl::InvalidArgumentError(StrCat("dp_size ", dp_size, " is below 1"));
  if (alignment < 1)
    return absl::InvalidArgumentError(StrCat("alignment ", alignment, " is below 1"));
  FlatLayout layout;
  layout.dp_size_ = dp_size;
  layout.alignment_ = alignment;
  std::set<std::string> names;
  int64_t flat_end = 0;
  for (const ParamSpec& p : params) {
    for (int64_t d : p.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(StrCat(
            "parameter '", p.name, "' has a negative dimension in ", ShapeToString(p.shape)));
      }
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(StrCat("parameter '", p.name, "' appears twice in a unit"));
    }
    const int64_t begin = RoundUp(flat_end, alignment);
    layout.flat_ranges_.push_back(Range{begin, begin + p.numel()});
    flat_end = begin + p.numel();
    layout.params_numel_ += p.numel();
  }
  layout.padded_numel_ =
      std::max<int64_t>(RoundUp(flat_end, dp_size * alignment), dp_size * alignment);
  layout.params_ = std::move(params);
  return layout;
}

std::vector<ShardPiece> FlatLayout::ShardPieces(int rank) const {
  const Range shard = shard_flat_range(rank);
  std::vector<ShardPiece> pieces;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Range flat = flat_ranges_[i].Intersect(shard);
    if (flat.empty()) continue;
    pieces.push_back(ShardPiece{static_cast<int>(i), flat.Shift(-flat_ranges_[i].begin),
                                flat.Shift(-shard.begin)});
  }
  return pieces;
}

}  // namespace zerort
