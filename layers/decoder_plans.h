// The decoder's memory plans: one pass's sizes (Geometry), a block's activation set and the
// backward's scratch, and the tables of what DecoderModel allocates, in order, with each buffer's
// bytes: a block's activation set (BlockActPlan), the backward's scratch (BackwardScratchPlan,
// BlockBackwardScratchPlan), the LLaMA projections' scratch, and a micro-batch's buffers outside
// the blocks (BeginPlan, SeqScratchPlan, HeadNormPlan, HeadPlan). The model allocates from these
// tables and the memory model (estimate/step_model.cc) replays them: this header is layers/'
// interface to estimate/ (built with zerort, not installed; the block's layer functions,
// decoder_block.h, stay internal to layers/). With the kernels' own (kernels/memory_facts.h)
// these are every activation and workspace byte of a step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/rope.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/memory.h"

namespace zerort::decoder {

// A block's saved activations, named for what they hold in every architecture: ln1 and ln2 the
// norms' outputs (ln*_mean: LayerNorm's only; ln*_rstd: both norms'), qkv (attention's input:
// GPT-2's fused projection, or rope(q), rope(k), v, [Note: the qkv layout]), atty (its
// output), att (its probabilities or log-sum-exps), res2 (the residual after attention), mlp_in
// (the MLP's first projection before its activation: GPT-2's fc; SwiGLU's gate and up side by
// side, ModelKernels::SwiGlu's layouts) and mlp_act (the activation's output: GELU(mlp_in) or
// SiLU(gate) x up), the down projection's input; with qk_norm (Qwen3's) qk_pre, q and k before
// their per-head norms ([rows, (h_l + kv_l) hs]: every query head's, then every key head's), and
// qk_rstd, each head's rstd ([rows h_l] then [rows kv_l]).
struct BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qk_pre, qk_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd,
      mlp_in, mlp_act;
};

// The sizes one rank works with in a pass: t tensor-parallel ranks, this one r.
struct Geometry {
  int t = 1, r = 0;
  bool sp = false;  // sequence parallelism in this pass: the residual stream split by rows
  int batch = 0, seq = 0;
  int64_t rows = 0, rows_l = 0;          // every row; this rank's rows of the residual stream
  int d = 0, d_l = 0, h_l = 0, f_l = 0;  // channels; attention channels (h_l hs), heads, MLP here
  BlockFeatures f;  // what the block computes ([Note: a block's features], decoder_config.h)
  // kRotary: kv_l key/value heads here of hs channels, rotated by `rope`; RMSNorm's eps.
  int kv_l = 0, hs = 0;
  float eps = 0;
  Rope rope = {};
  int v_l = 0, v_begin = 0, v_valid = 0;  // vocabulary rows here, the first one's id, real ones
  // Every vocabulary row on this rank (padded or not): the fused cross-entropy, one pass a row
  // (ModelKernels::CrossEntropy), else the vocabulary-parallel one's three with its statistics.
  bool whole_vocab() const { return t == 1; }
};

Geometry MakeGeometry(const DecoderModelOptions& o, int batch, int seq);

// The same for tensor-parallel rank `tp_rank` of `tp_size` without a model (the memory model).
Geometry MakeGeometry(const DecoderConfig& c, int tp_size, int tp_rank, bool sequence_parallel,
                      int vocab_multiple, int batch, int seq);

// A token's row of the attention's qkv here: h_l query heads, kv_l key and kv_l value heads of hs
// ([Note: the qkv layout], kernels/model_math.h); 3 d_l for GPT-2.
inline int64_t QkvCols(const Geometry& g) { return int64_t{g.h_l + 2 * g.kv_l} * g.hs; }

// dbtc's columns: a column-parallel layer's input gradient [rows, d], which also holds the
// attention output's gradient [rows, d_l] before the output projection's backward; d_l is above d
// only with a head_dim wider than d_model / n_head (Mistral-Nemo's).
inline int64_t DbtcCols(const Geometry& g) { return std::max<int64_t>(g.d, g.d_l); }

// Scratch of the backward: gradients of activations (kWorkspace). A LLaMA block's d4a holds
// d(SwiGLU output), then d(qkv) [rows, max(f_l, QkvCols)]; its d4b d(gate), d(up), then d(q),
// d(k), d(v) [rows, max(2 f_l, QkvCols)].
struct BackwardScratch {
  Buffer dres;   // [rows_l, d]: the gradient flowing down the residual stream (this rank's rows)
  Buffer dfull;  // [rows, d]: dres gathered from every rank (sequence parallelism)
  Buffer dbtc;   // [rows, DbtcCols]: [rows, d], or the attention output's [rows, d_l]
  Buffer dloc;   // [rows_l, d]: dbtc reduce-scattered (sequence parallelism)
  Buffer d4a;    // [rows, 4d / tp] (GPT-2)
  Buffer d4b;    // [rows, 4d / tp] (GPT-2)
  // [4d] grad dtype: the norms' weight gradients of this rank's rows (SP); with QkNormGradsSummed,
  // then q_norm's and k_norm's [2 hs] (from QkNormGradOffset).
  Buffer norm;
};

// [Note: per-head norms under tensor parallelism] Qwen3's q_norm and k_norm (qk_norm) are one
// [hs] gain each, replicated over the tensor-parallel group, and every head applies it: a rank's
// gradient of it is its own heads' part. So under tensor parallelism the block's backward writes
// those parts into BackwardScratch::norm from QkNormGradOffset, after the norms' own (SP), and
// ReduceNormGrads all-reduces them over the group with those (one collective) and adds the sums
// to the gains' gradients (every rank then holds the same whole gradient, as a replicated
// parameter must); on one rank they go to the gradients directly.
inline bool QkNormGradsSummed(const Geometry& g) { return g.f.qk_norm && g.t > 1; }
inline int64_t QkNormGradOffset(const Geometry& g) { return 4 * int64_t{g.d}; }

// [Note: the backward's scratch] What a micro-batch's backward allocates when it begins, in order,
// with each buffer's bytes (d4a and d4b follow at the first block's backward): the table
// DecoderStages::EnsureBackwardScratch allocates and the memory model replays. `head_gave_dbtc`:
// the head's forward already holds dbtc (a training HeadForward on the last stage).
struct ScratchBuffer {
  Buffer BackwardScratch::*member;
  int64_t bytes;
};
std::vector<ScratchBuffer> BackwardScratchPlan(const Geometry& g, int64_t act, int64_t grad,
                                               bool head_gave_dbtc);
// The MLP's gradients d4a and d4b, allocated at the first block's backward.
std::vector<ScratchBuffer> BlockBackwardScratchPlan(const Geometry& g, int64_t act);

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

// [Note: a LLaMA block's projections] A LLaMA block keeps Q, K and V as three parameters (as
// Hugging Face's files do: their tensor-parallel splits and checkpoints are each its own). Where
// they lie back to back in the unit, as the shard manager's FlatLayout puts them when each one's
// elements are a multiple of its alignment (QkvFusedInLayout), they are one [(h_l + 2 kv_l) hs, d]
// weight (and bias): one GEMM writes q, k, v in qkv's layout ([Note: the qkv layout]) and
// RopeQkvInPlace turns them there; the backward turns dqkv back in place and runs one GEMM's
// input and weight gradients. Otherwise (tensors elsewhere: a test's store, odd sizes) three
// GEMMs write the projections to a scratch of ProjectionScratchBytes ([rows, (h_l + 2 kv_l) hs],
// act dtype, kWorkspace), freed once RopeQkv has read them into qkv, and the backward's dq, dk,
// dv take d4b. The model decides by the tensors' addresses, the memory model by the layout's rule:
// the same answer for the shard manager's units. ProjectionScratchBytes is 0 for GPT-2 (its
// fused QKV goes straight into qkv).
// The MLP's gate and up projections likewise (GateUpFusedInLayout): one GEMM writes a row's gate
// then its up into mlp_in, SwiGlu reads them interleaved, and the backward runs one GEMM's
// gradients from d4b in the same layout; apart, two GEMMs write mlp_in planar. The same memory
// either way.
bool QkvFusedInLayout(const Geometry& g, int64_t alignment);
// The attention's shape on one of `tp` tensor-parallel ranks at micro-batch `batch`, as the CUDA
// flash kernels are asked about it (model.attention_backend's check, kernels/flash_attention.h).
internal::FlashAttentionShape AttentionShapeOf(const DecoderConfig& c, int tp, int batch);
bool GateUpFusedInLayout(const Geometry& g, int64_t alignment);
int64_t ProjectionScratchBytes(const Geometry& g, int64_t act);

// [Note: a micro-batch's buffers] In allocation order, per call:
//   Begin         tokens, targets (int32 [rows]; targets when there is a loss); when the blocks
//                 recompute their forward, one block activation set (BlockActPlan's), reused by
//                 every block; the residual stream [rows_l, d] at every block boundary the stage
//                 touches (BoundaryUsed); under sequence parallelism the forward's scratch
//                 seq_local [rows_l, d] and seq_full [rows, d] (kWorkspace, until the backward's
//                 scratch replaces them).
//   HeadForward   the final LayerNorm's output (every row, [rows, d]) and its statistics
//                 ([rows_l] each); once the head's unit is open, the losses ([rows], stat), the
//                 gradient of the LayerNorm output (dbtc [rows, DbtcCols], kWorkspace, when
//                 training)
//                 and one chunk of the logits ([chunk, v_l], kWorkspace, freed when the head
//                 ends); the vocabulary-parallel cross-entropy's statistics per chunk
//                 (VocabParallelCrossEntropyScratch, tp_layers.h).
//   BlocksBackward the MLP's gradients d4a and d4b ([rows, f_l] each, kWorkspace) at the first
//                 block's backward (BlockBackwardScratchPlan, above); with recomputation
//                 under sequence parallelism, each recomputed forward's seq_local and seq_full.
enum class MbBuffer {
  kTokens,
  kTargets,
  kBlockActs,  // a block activation set (BlockActPlan), allocated by AllocateBlockActs
  kBoundary,   // block_out[index]
  kSeqLocal,
  kSeqFull,
  kLnf,
  kLnfMean,
  kLnfRstd,
  kLosses,
  kDbtc,
  kLogits,
};

struct MbPlanned {
  MbBuffer buffer;
  int index = 0;  // the boundary (kBoundary)
  MemoryCategory category = MemoryCategory::kActivations;
  int64_t bytes = 0;  // 0 for kBlockActs (BlockActPlan has its sizes)
};

// Whether a stage keeps the residual stream at boundary `l` (0: the embeddings' output, l > 0:
// block l - 1's): the inputs and outputs of its blocks, the embeddings' output on the first
// stage, the last block's on the last.
bool BoundaryUsed(const DecoderStagePart& part, int n_layer, int l);

// Begin's buffers. `per_block`: every block allocates its own set (training without
// recomputation), so Begin allocates none.
std::vector<MbPlanned> BeginPlan(const Geometry& g, const DecoderStagePart& part, int n_layer,
                                 int64_t act, bool targets, bool per_block);

// The tensor-parallel forward's scratch under sequence parallelism (empty otherwise): Begin's,
// and each recomputed forward's in the backward.
std::vector<MbPlanned> SeqScratchPlan(const Geometry& g, int64_t act);

// HeadForward's final LayerNorm buffers, allocated before the norm's unit opens.
std::vector<MbPlanned> HeadNormPlan(const Geometry& g, int64_t act, int64_t stat);

// HeadForward's buffers once the head's unit is open; `chunk` rows of logits at a time.
std::vector<MbPlanned> HeadPlan(const Geometry& g, int64_t act, int64_t stat, bool targets,
                                bool train, int64_t chunk);

}  // namespace zerort::decoder
