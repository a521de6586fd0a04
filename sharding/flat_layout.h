// FlatLayout: where each parameter of a unit lives in the unit's flat vector, how that vector is
// padded, and which pieces of which parameters fall in each rank's shard. A pure function of the
// parameter list, the data-parallel size and the alignment; the shard manager and the memory
// estimator both use it, so they cannot disagree.
//
// Each parameter starts at a multiple of `alignment` elements (so views into the gathered buffer
// are aligned for vector loads and GEMMs); the flat vector is padded to a multiple of
// dp_size * alignment, so every shard has the same size and starts aligned. Padding elements
// belong to no parameter and stay zero.
#pragma once

#include <string>
#include <vector>

#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"
#include "zerort/sharding/range.h"

namespace zerort {

// Where a tensor-parallel rank's parameter lies in its global tensor (Megatron's splits). The
// split dimension holds `groups` equal blocks stacked (a fused QKV weight: Q, K, V), each cut
// into `parts` contiguous pieces; rank `part` holds piece `part` of every block, so it has the
// same heads of Q, K and V. With split_dim -1 the parameter is whole (replicated) on every rank.
struct GlobalFrame {
  int split_dim = -1;
  int parts = 1;   // the tensor-parallel size
  int part = 0;    // this rank's index in the tensor-parallel group
  int groups = 1;  // blocks stacked along split_dim
  // Rows of dimension 0 of the global tensor that are real; the rest is padding (a vocabulary
  // padded to a multiple of the tensor-parallel size). -1: every row. Padding is never saved.
  int64_t valid_rows = -1;
  friend bool operator==(const GlobalFrame&, const GlobalFrame&) = default;
};

struct ParamSpec {
  std::string name;          // "blocks.3.attn.qkv.weight"
  Shape shape;               // the local shape (this rank's part of the global tensor)
  bool weight_decay = true;  // false for biases and norms, as GPT-2 training does
  GlobalFrame frame;         // how the local shape sits in the global one
  int64_t numel() const { return NumElements(shape); }
  Shape global_shape() const;
  int64_t global_numel() const { return NumElements(global_shape()); }
  // The global tensor without padding rows (frame.valid_rows): what checkpoints and exports hold.
  // Row-major, so its elements are global indices [0, real_numel()).
  Shape real_shape() const;
  int64_t real_numel() const { return NumElements(real_shape()); }
};

// The ParamSpec of this rank's part of a tensor of `global_shape` split as `frame` says; fails
// when the split dimension does not divide into groups x parts equal pieces.
StatusOr<ParamSpec> SplitParam(std::string name, Shape global_shape, bool weight_decay,
                               GlobalFrame frame);
// The position in the global tensor (flattened row-major) of local element `local_index`.
int64_t GlobalIndex(const ParamSpec& spec, int64_t local_index);
// Local elements [k C, (k + 1) C) are contiguous in the global tensor too, for this C (the whole
// tensor when it is not split or split along dimension 0 in one block; one row of a
// row-parallel weight).
int64_t ContiguousRun(const ParamSpec& spec);
// Local elements [begin, end) as runs contiguous in the global tensor, padding rows
// (frame.valid_rows) left out: what checkpoints store and read.
struct GlobalRun {
  int64_t local = 0, global = 0, length = 0;
};
std::vector<GlobalRun> RealGlobalRuns(const ParamSpec& spec, int64_t begin, int64_t end);

// A part of one parameter that lies in one rank's shard.
struct ShardPiece {
  int param = 0;      // index into FlatLayout::params()
  Range param_range;  // elements of the (flattened) parameter
  Range shard_range;  // where they are in the shard
};

class FlatLayout {
 public:
  static constexpr int64_t kDefaultAlignment = 16;  // elements: 64 B in fp32, 32 B in bf16

  // Fails on an empty list, duplicate names, negative dimensions or a non-positive dp_size /
  // alignment; never on sizes (uneven sizes are padded).
  static StatusOr<FlatLayout> Create(std::vector<ParamSpec> params, int dp_size,
                                     int64_t alignment = kDefaultAlignment);

  const std::vector<ParamSpec>& params() const { return params_; }
  int dp_size() const { return dp_size_; }
  int64_t alignment() const { return alignment_; }
  int64_t params_numel() const { return params_numel_; }  // sum of parameter sizes
  int64_t padded_numel() const { return padded_numel_; }  // the flat vector, padding included
  int64_t shard_numel() const { return padded_numel_ / dp_size_; }

  Range flat_range(int param) const { return flat_ranges_.at(param); }
  // The rank's shard in the flat frame.
  Range shard_flat_range(int rank) const {
    return Range{rank * shard_numel(), (rank + 1) * shard_numel()};
  }
  // The pieces of parameters in the rank's shard, in flat order.
  std::vector<ShardPiece> ShardPieces(int rank) const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<Range> flat_ranges_;
  int dp_size_ = 1;
  int64_t alignment_ = kDefaultAlignment;
  int64_t params_numel_ = 0;
  int64_t padded_numel_ = 0;
};

}  // namespace zerort
