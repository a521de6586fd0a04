// What DecoderModel allocates for a micro-batch outside its blocks' activation sets: one table per
// call, which the model allocates from and the memory model (estimate/step_model.cc) replays
// (internal: not installed). With BlockActPlan and BackwardScratchPlan (decoder_block.h) and the
// kernels' own (kernels/memory_facts.h) these are every activation and workspace byte of a step.
#pragma once

#include <cstdint>
#include <vector>

#include "zerort/layers/decoder_block.h"
#include "zerort/runtime/memory.h"

namespace zerort::decoder {

// [Note: a micro-batch's buffers] In allocation order, per call:
//   Begin         tokens, targets (int32 [rows]; targets when there is a loss); when the blocks
//                 recompute their forward, one block activation set (BlockActPlan's), reused by
//                 every block; the residual stream [rows_l, d] at every block boundary the stage
//                 touches (BoundaryUsed); under sequence parallelism the forward's scratch
//                 seq_local [rows_l, d] and seq_full [rows, d] (kWorkspace, until the backward's
//                 scratch replaces them).
//   HeadForward   the final LayerNorm's output (every row, [rows, d]) and its statistics
//                 ([rows_l] each); once the head's unit is open, the losses ([rows], stat), the
//                 gradient of the LayerNorm output (dbtc [rows, d], kWorkspace, when training)
//                 and one chunk of the logits ([chunk, v_l], kWorkspace, freed when the head
//                 ends); the vocabulary-parallel cross-entropy's statistics per chunk
//                 (VocabParallelCrossEntropyScratch, tp_layers.h).
//   BlocksBackward the MLP's gradients d4a and d4b ([rows, f_l] each, kWorkspace) at the first
//                 block's backward (BlockBackwardScratchPlan, decoder_block.h); with recomputation
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
