// Tensor parallelism, as far as this issue goes: every linear and embedding layer is declared
// with the tensor-parallel group it belongs to and the dimension it splits (Megatron's column-
// and row-parallel linears, the vocabulary-parallel embedding), and records that dimension in its
// ParamSpec. The group has size 1 today; the column/row communication (all-reduce of a row-
// parallel output, of a column-parallel input's gradient) goes in the marked places of
// gpt_model.cc when a later issue adds it, and a size above 1 is refused until then.
#pragma once

#include <string>

#include "runtime/communicator.h"
#include "runtime/status.h"
#include "sharding/flat_layout.h"

namespace zerort {

struct TensorParallelGroup {
  Communicator* comm = nullptr;  // null: size 1
  int size() const { return comm == nullptr ? 1 : comm->size(); }
  int rank() const { return comm == nullptr ? 0 : comm->rank(); }
};

// How a layer's weight is split over the tensor-parallel group.
enum class TensorSplit {
  kReplicated,  // norms: every rank holds all of it
  kColumn,      // linear [out, in] split along out (dim 0), bias split too: QKV, MLP fc
  kRow,         // linear [out, in] split along in (dim 1), bias replicated: attn proj, MLP proj
  kVocab,       // embedding [vocab, channels] split along vocab (dim 0)
};

// The ParamSpec of a weight of global shape `global_shape` on one rank of `tp`: the local shape
// and the split dimension. The split dimension must divide by the group size.
StatusOr<ParamSpec> TensorParallelParam(std::string name, Shape global_shape, bool weight_decay,
                                        TensorSplit split, const TensorParallelGroup& tp);

}  // namespace zerort
