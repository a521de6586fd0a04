// Tensor parallelism: every linear and embedding layer declares how its weight splits over the
// tensor-parallel group (Megatron's column- and row-parallel linears, the vocabulary-parallel
// embedding, the fused QKV split per head), and its ParamSpec carries the global frame
// (sharding/flat_layout.h: global shape, split dimension, this rank's part), which
// initialisation, the estimator and checkpoints read. The communication is tp_layers.h's.
#pragma once

#include <string>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/flat_layout.h"

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

// The ParamSpec of this rank's part of a weight of global shape `global_shape` at tensor-parallel
// size `tp_size`: the local shape and its global frame. `groups` > 1 splits a fused weight per
// block (QKV: 3, so each rank holds Q, K and V of the same heads). A row-parallel bias is whole
// (added once, after the reduction). Pure: the estimator and checkpoints read the same frame.
StatusOr<ParamSpec> TensorParallelSpec(std::string name, Shape global_shape, bool weight_decay,
                                       TensorSplit split, int tp_size, int tp_rank, int groups = 1);

}  // namespace zerort
