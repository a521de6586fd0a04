// The decoder's block layers over ModelKernels, shared by DecoderModel's stage primitives
// (internal: not installed). One pass's sizes (Geometry), what the layer functions share (Ctx), a
// block's activation set (BlockActs) and the backward's scratch; the tensor- and sequence-parallel
// transitions (Megatron's f and g, SP's gather/scatter) around the LayerNorms and linears.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "zerort/layers/decoder_model.h"
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
// in this order; LlamaSlot says where each is.
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
  kLlamaParams,
};

// A block's saved activations, named for what they hold in every architecture: ln1 and ln2 the
// norms' outputs (ln*_mean: LayerNorm's only; ln*_rstd: both norms'), qkv (attention's input:
// GPT-2's fused projection, or rope(q), rope(k), v with the key/value heads repeated), atty (its
// output), att (its probabilities or log-sum-exps), res2 (the residual after attention), mlp_in
// (the MLP's first projection before its activation: GPT-2's fc, SwiGLU's gate), mlp_up
// (SwiGLU's up projection; GPT-2 has none) and mlp_act (the activation's output: GELU(mlp_in) or
// SiLU(mlp_in) x mlp_up), the down projection's input.
struct BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, mlp_in, mlp_up,
      mlp_act;
};

// The sizes one rank works with in a pass: t tensor-parallel ranks, this one r.
struct Geometry {
  int t = 1, r = 0;
  bool sp = false;  // sequence parallelism in this pass: the residual stream split by rows
  int batch = 0, seq = 0;
  int64_t rows = 0, rows_l = 0;          // every row; this rank's rows of the residual stream
  int d = 0, d_l = 0, h_l = 0, f_l = 0;  // channels; attention channels, heads, MLP channels here
  // LLaMA: RMSNorm (eps), rotary embeddings, kv_l key/value heads here of hs channels, the
  // biases the block has.
  bool llama = false;
  int kv_l = 0, hs = 0;
  float eps = 0;
  Rope rope = {};
  bool qkv_bias = false, o_proj_bias = false, mlp_bias = false;
  int v_l = 0, v_begin = 0, v_valid = 0;  // vocabulary rows here, the first one's id, real ones
  bool whole_vocab() const { return t == 1 && v_l == v_valid; }
};

Geometry MakeGeometry(const DecoderModelOptions& o, int batch, int seq);

// Where parameter `p` of a LLaMA block is in its unit, or -1 when the block has none.
int LlamaSlot(const Geometry& g, LlamaParam p);
// The same for tensor-parallel rank `tp_rank` of `tp_size` without a model (the memory model).
Geometry MakeGeometry(const DecoderConfig& c, int tp_size, int tp_rank, bool sequence_parallel,
                      int vocab_multiple, int batch, int seq);

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

// Issues a block's forward: x -> out (this rank's rows), saving what the backward needs in `a`.
Status BlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                    void* out);

// Scratch of the backward: gradients of activations (kWorkspace). A LLaMA block's d4a holds
// d(SwiGLU output), then d(qkv) [rows, max(f_l, 3 d_l)]; its d4b d(gate), d(up), then d(q), d(k),
// d(v) [rows, max(2 f_l, (h_l + 2 kv_l) hs)].
struct BackwardScratch {
  Buffer dres;   // [rows_l, d]: the gradient flowing down the residual stream (this rank's rows)
  Buffer dfull;  // [rows, d]: dres gathered from every rank (sequence parallelism)
  Buffer dbtc;   // [rows, d]
  Buffer dloc;   // [rows_l, d]: dbtc reduce-scattered (sequence parallelism)
  Buffer d4a;    // [rows, 4d / tp] (GPT-2)
  Buffer d4b;    // [rows, 4d / tp] (GPT-2)
  Buffer norm;   // [4d] grad dtype: LayerNorm weight gradients of this rank's rows (SP)
};

// [Note: the backward's scratch] What a micro-batch's backward allocates when it begins, in order,
// with each buffer's bytes (d4a and d4b follow at the first block's backward): the table
// DecoderModel::EnsureBackwardScratch allocates and the memory model replays. `head_gave_dbtc`: the
// head's forward already holds dbtc (a training HeadForward on the last stage).
struct ScratchBuffer {
  Buffer BackwardScratch::*member;
  int64_t bytes;
};
std::vector<ScratchBuffer> BackwardScratchPlan(const Geometry& g, int64_t act, int64_t grad,
                                               bool head_gave_dbtc);
// The MLP's gradients d4a and d4b, allocated at the first block's backward.
std::vector<ScratchBuffer> BlockBackwardScratchPlan(const Geometry& g, int64_t act);

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
Status ReduceNormGrads(const Ctx& c, BackwardScratch& s,
                       std::initializer_list<std::pair<void*, void*>> targets);

// A block's backward: dres holds d(out) on entry and d(x) on return (this rank's rows); weight
// gradients are added.
Status BlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                     BackwardScratch& s);

// [Note: a block's activation set] What one block keeps from its forward for its backward, in
// allocation order, with each buffer's bytes: under tensor parallelism the column layers' outputs
// hold this rank's columns, the residual stream and the LayerNorm statistics this rank's rows
// (sequence parallelism); `attention_saved` is ModelKernels::AttentionSavedBytes. This one table
// is what AllocateBlockActs allocates and what the memory model (estimate/step_model.cc) replays.
struct BlockActBuffer {
  Buffer BlockActs::*member;
  int64_t bytes;
};
std::vector<BlockActBuffer> BlockActPlan(const Geometry& g, int64_t act, int64_t stat,
                                         int64_t attention_saved);

// [Note: a LLaMA block's projections] The forward's Q, K and V projections before the rotation
// ([rows, (h_l + 2 kv_l) hs], act dtype, kWorkspace): allocated by a LLaMA block's forward and
// freed once RopeQkv has read them. 0 for GPT-2 (its fused QKV goes straight into qkv).
int64_t ProjectionScratchBytes(const Geometry& g, int64_t act);

// A LLaMA block's forward and backward (llama_block.cc): what BlockForward and BlockBackward run
// when g.llama.
Status LlamaBlockForward(const Ctx& c, const std::vector<void*>& w, const void* x, BlockActs& a,
                         void* out);
Status LlamaBlockBackward(const Ctx& c, const UnitTensors& u, const void* x, const BlockActs& a,
                          BackwardScratch& s);

// A block's activation set (allocated by its forward, freed by its backward): BlockActPlan's.
Status AllocateBlockActs(const Geometry& g, ModelKernels& k, Allocator& activations, BlockActs& a);

}  // namespace zerort::decoder
