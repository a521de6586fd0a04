// FlatLayout construction and shard pieces.
#include "zerort/sharding/flat_layout.h"

#include <algorithm>
#include <set>

#include "zerort/runtime/memory.h"
#include "zerort/runtime/strings.h"

namespace zerort {
Shape ParamSpec::global_shape() const {
  Shape g = shape;
  if (frame.split_dim >= 0) g[frame.split_dim] *= frame.parts;
  return g;
}

Shape ParamSpec::real_shape() const {
  Shape g = global_shape();
  if (frame.valid_rows >= 0 && !g.empty()) g[0] = std::min(g[0], frame.valid_rows);
  return g;
}

int64_t ContiguousRun(const ParamSpec& spec) {
  const GlobalFrame& f = spec.frame;
  if (f.split_dim < 0 || f.parts == 1) return std::max<int64_t>(spec.numel(), 1);
  int64_t run = spec.shape[f.split_dim] / f.groups;
  for (size_t d = f.split_dim + 1; d < spec.shape.size(); ++d) run *= spec.shape[d];
  return std::max<int64_t>(run, 1);
}

std::vector<GlobalRun> RealGlobalRuns(const ParamSpec& spec, int64_t begin, int64_t end) {
  std::vector<GlobalRun> runs;
  const int64_t run = ContiguousRun(spec), real = spec.real_numel();
  for (int64_t i = begin; i < end;) {
    const int64_t n = std::min(end, (i / run + 1) * run) - i;
    const int64_t g = GlobalIndex(spec, i);
    if (g < real) runs.push_back({i, g, std::min(n, real - g)});
    i += n;
  }
  return runs;
}

StatusOr<ParamSpec> SplitParam(std::string name, Shape global_shape, bool weight_decay,
                               GlobalFrame frame) {
  ParamSpec spec{std::move(name), global_shape, weight_decay, frame};
  if (frame.split_dim < 0) {
    spec.frame = GlobalFrame{};
    return spec;
  }
  const int64_t cut = int64_t{frame.parts} * frame.groups;
  if (frame.split_dim >= static_cast<int>(global_shape.size()) || frame.parts < 1 ||
      frame.groups < 1 || frame.part < 0 || frame.part >= frame.parts ||
      global_shape[frame.split_dim] % cut != 0) {
    return absl::InvalidArgumentError(
        StrCat("'", spec.name, "': dimension ", frame.split_dim, " of ",
               fmt::format("{}", fmt::join(global_shape, "x")), " does not split into ",
               frame.groups, " x ", frame.parts, " equal pieces"));
  }
  spec.shape[frame.split_dim] /= frame.parts;
  return spec;
}

int64_t GlobalIndex(const ParamSpec& spec, int64_t local_index) {
  const GlobalFrame& f = spec.frame;
  if (f.split_dim < 0 || f.parts == 1) return local_index;
  int64_t inner = 1;
  for (size_t d = f.split_dim + 1; d < spec.shape.size(); ++d) inner *= spec.shape[d];
  const int64_t local_len = spec.shape[f.split_dim];
  const int64_t global_len = local_len * f.parts;
  const int64_t piece = local_len / f.groups;  // this rank's rows of one stacked block
  const int64_t outer = local_index / (local_len * inner);
  const int64_t rest = local_index % (local_len * inner);
  const int64_t row = rest / inner;
  const int64_t group = row / piece;
  const int64_t global_row = group * (global_len / f.groups) + f.part * piece + row % piece;
  return (outer * global_len + global_row) * inner + rest % inner;
}

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
