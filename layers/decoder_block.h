// The decoder's block layers over ModelKernels, shared by DecoderModel's stage primitives
// (internal to layers/). A block's parameters in their unit, what the layer functions share
// (Ctx), the tensor- and sequence-parallel transitions (Megatron's f and g, SP's gather/scatter)
// around the norms and linears, and a block's forward and backward. The sizes, buffer sets and
// allocation tables they use are decoder_plans.h's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "zerort/layers/decoder_model.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/layers/tp_layers.h"
#include "zerort/runtime/allocator.h"

namespace zerort::decoder {

// Parameters of a block unit, in their order in the unit.
enum BlockParam {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
};

// Parameters of a LLaMA block, in their order in the unit (decoder_params.cc): the weights, then
// the biases the config has (qkv_bias: Q, K, V, Qwen2's; o_proj_bias: O; mlp_bias: gate, up, down),
// then Qwen3's per-head norms (qk_norm: q's, k's), in this order; LlamaSlot says where each is.
enum LlamaParam {
  kAttnNorm,
  kQW,
  kKW,
  kVW,
  kOW,
  kMlpNorm,
  kGateW,
  kUpW,
  kDownW,
  kQB,
  kKB,
  kVB,
  kOB,
  kGateB,
  kUpB,
  kDownB,
  kQNorm,
  kKNorm,
  kLlamaParams,
};

// Where parameter `p` of a LLaMA block is in its unit, or -1 when the block has none.
int LlamaSlot(const Geometry& g, LlamaParam p);
// What the layer functions below share in one pass.
struct Ctx {
  ModelKernels& k;
  const TpContext& tp;
  const Geometry& g;
  void* seq_local;  // [rows_l, d] scratch (sequence parallelism)
  void* seq_full;   // [rows, d] scratch (tensor parallelism)
};

// LayerNorm of this rank's rows of the residual stream; `out` gets every row (the input of a
// column-parallel layer): under sequence parallelism gathered from the other ranks (SP's g).
Status NormToColumn(const Ctx& c, void* out, void* mean, void* rstd, const void* x, const void* w,
                    const void* b);
// x += residual, then NormToColumn of x, in one pass over each row (ModelKernels::AddLayerNorm).
Status AddNormToColumn(const Ctx& c, void* out, void* mean, void* rstd, void* x,
                       const void* residual, const void* w, const void* b);

// A row-parallel layer's output into this rank's rows of the residual stream: partial sums
// all-reduced (Megatron's g) or, under sequence parallelism, reduce-scattered; the bias added
// once, after the reduction.
Status RowToResidual(const Ctx& c, void* out, const void* x_local, const void* w, const void* b,
                     int in_local);
// RowToResidual, then out += residual: without tensor parallelism one call
// (ModelKernels::MatmulResidual: on CUDA one cuBLASLt GEMM with the residual as its C).
Status RowToResidualAdd(const Ctx& c, void* out, const void* x_local, const void* w, const void* b,
                        int in_local, const void* residual);

// Issues a block's forward: x -> out (this rank's rows), saving what the backward needs in `a`.
Status BlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                    void* out);

// The residual gradient of every row, for a row-parallel layer's backward: under sequence
// parallelism gathered (the reduce-scatter's backward), otherwise dres itself.
StatusOr<const void*> ResidualGradOfEveryRow(const Ctx& c, BackwardScratch& s);

// A column-parallel layer's input gradient (dbtc, this rank's columns' share of every row)
// summed over the group: all-reduced (Megatron's f backward) or, under sequence parallelism,
// reduce-scattered to this rank's rows. Returns where it is.
StatusOr<const void*> ReduceColumnInputGrad(const Ctx& c, BackwardScratch& s);

// A LayerNorm's backward on this rank's rows. Under sequence parallelism its weight gradients
// cover only these rows: they go to s.norm at `slot` (of 2 x d) and ReduceNormGrads sums them.
Status NormBackward(const Ctx& c, BackwardScratch& s, int slot, const void* dout, const void* x,
                    const std::vector<void*>& w, const std::vector<void*>& grads, int weight,
                    const void* mean, const void* rstd);

// Sums the `norms` LayerNorms' gradients in s.norm over the group (one all-reduce) and adds
// them to the weights' gradients; `targets` lists each norm's weight gradient, bias next to it.
// `qk_norms`: a Qwen3 block's q_norm and k_norm gradients, whose parts in s.norm the same
// all-reduce sums ([Note: per-head norms under tensor parallelism]); null for other blocks.
Status ReduceNormGrads(const Ctx& c, BackwardScratch& s,
                       std::initializer_list<std::pair<void*, void*>> targets,
                       std::pair<void*, void*> qk_norms = {nullptr, nullptr});

// A block's backward: dres holds d(out) on entry and d(x) on return (this rank's rows); weight
// gradients are added.
Status BlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                     BackwardScratch& s);

// A LLaMA block's forward and backward (llama_block.cc): what BlockForward and BlockBackward run
// for QkvKind::kRotary (the LLaMA family's feature set, [Note: a block's features]).
Status LlamaBlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                         void* out);
Status LlamaBlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                          BackwardScratch& s);

// A block's activation set (allocated by its forward, freed by its backward): BlockActPlan's.
Status AllocateBlockActs(const Geometry& g, ModelKernels& k, Allocator& activations, BlockActs& a);

}  // namespace zerort::decoder
