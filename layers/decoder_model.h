// DecoderModel: the built-in decoder-only transformer (token embeddings, pre-norm blocks of causal
// self-attention and an MLP, a final norm, the output projection, softmax cross-entropy), forward
// and backward on any ModelKernels, with its weights in a WeightStore. DecoderConfig describes the
// block (decoder_config.h): GPT-2's (learned positions, LayerNorm, a fused QKV projection, a 4x
// tanh-GELU MLP, every bias, the head tied to the token embedding) or the LLaMA family's (rotary
// positions, RMSNorm, Q/K/V with grouped key/value heads, a SwiGLU MLP, biases per projection, the
// head tied or not): [Note: the two architectures] in layers/README.md.
//
// Units (what the shard manager gathers and releases together): 0 = "embeddings" (wte, and wpe
// with learned positions), 1..n_layer = "blocks.i", n_layer + 1 = "final_norm", and "head"
// (lm_head) when it is not tied. Order of use in a training micro-batch (tied):
//   forward:  embeddings, blocks.0 .. blocks.L-1, final_norm;
//   backward: embeddings (the tied output projection: opened for the logits and kept open, since
//             its gradient gets a second contribution from the input embedding at the very end),
//             final_norm, blocks.L-1 .. blocks.0, then embeddings closed.
// Under ZeRO-3 a block's weights are gathered only while that block computes (forward, and again
// for its backward).
//
// Activations (accounted as kActivations in the allocator's tracker): per block, the tensors its
// backward needs (llm.c's set: ln1 and its statistics, qkv, attention probabilities, attention
// output, residual, ln2 and its statistics, MLP pre- and post-GELU, block output). With
// activation checkpointing only each block's input is kept, and one block's set is recomputed at a
// time during the backward. Gradients of activations are kWorkspace.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/decoder_config.h"
#include "zerort/layers/tensor_parallel.h"
#include "zerort/layers/weight_store.h"
#include "zerort/runtime/allocator.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

// The part of the model a pipeline stage holds: some blocks (in model chunks), the input
// embedding on the first stage, the final LayerNorm and the tied head on the last. With p > 1
// the first and last stages each hold the "embeddings" unit (wte, wpe; the last uses wte only),
// tied over `embedding_group`: the shard manager sums its gradient over the two and counts it
// in the norm on the first stage only.
struct DecoderStagePart {
  std::vector<std::pair<int, int>> chunks;  // blocks [first, last) per local chunk; empty: all
  bool first = true;                        // the input embedding
  bool last = true;                         // the final LayerNorm, the head and the loss
  Communicator* embedding_group = nullptr;  // first and last stage (null when one stage)
  bool holds(int block) const;
};

struct DecoderModelOptions {
  DecoderConfig config;
  int micro_batch = 1;                    // sequences per micro-batch: the activation sizes
  bool activation_checkpointing = false;  // recompute each block's forward in its backward
  // Tensor parallelism (Megatron): heads, MLP channels and vocabulary split over `tp`; the
  // weights are this rank's parts (DecoderUnits below). The store holds this rank's units only.
  TensorParallelGroup tp = {};
  // Sequence parallelism: the residual stream, LayerNorms and their statistics split by rows
  // over `tp` (all-gathers and reduce-scatters instead of all-reduces). Any contiguous split of
  // the batch x seq rows is valid, since every op between the TP regions works per row; a pass
  // whose rows tp does not divide (a short prompt) runs without it, with the same values.
  bool sequence_parallel = false;
  int vocab_multiple = 1;  // Megatron's make_vocab_size_divisible_by (x tp): wte's padding
  // Rows of the head's logits [rows, vocab / tp] that exist at a time (HeadForward); 0: automatic
  // (HeadChunkRows).
  int64_t head_chunk_rows = 0;
  DecoderStagePart stage = {};  // pipeline parallelism: what this rank holds (default: everything)
};

// A target whose loss is masked (Megatron's eod_mask_loss; PyTorch's ignore_index): its row adds
// no loss and no gradient, and a micro-batch's mean is over its other rows ([Note: masked
// targets], decoder_model.cc).
inline constexpr int32_t kIgnoreTarget = -1;

// The model's units as ParamSpecs (see the unit list above). GPT-2's names follow its structure:
// wte, wpe, blocks.i.{ln1,attn.qkv,attn.proj,ln2,mlp.fc,mlp.proj}.{weight,bias},
// ln_f.{weight,bias}; the LLaMA family's are Hugging Face's (decoder_params.cc).
//
// [Note: parameter roles] Each parameter is declared with what it is, its ParamRole, from which
// its initialisation and its weight decay follow: no code after the declaration reads a
// parameter's name to decide what to do with it. An architecture that adds a parameter (an o_proj
// bias, a gated MLP's up projection) declares its role where it declares its shape.
enum class ParamRole : uint8_t {
  kWeight,          // a linear or embedding weight: normal(0, 0.02), decayed
  kResidualWeight,  // GPT-2's projections into the residual stream: normal(0, 0.02 / sqrt(2 L))
  kBias,            // 0, not decayed
  kNormGain,        // LayerNorm's and RMSNorm's gains: 1, not decayed
};
bool Decayed(ParamRole role);
struct DecoderUnit {
  std::string name;
  std::vector<ParamSpec> params;
  std::vector<ParamRole> roles;  // params[i] is a roles[i]
};
// The units of tensor-parallel rank `tp_rank` of `tp_size`, with each parameter's global frame
// (wte's global shape is the padded vocabulary, PaddedVocab). Pure (no group needed): the model,
// the estimator and checkpoints all use it.
StatusOr<std::vector<DecoderUnit>> DecoderUnits(const DecoderConfig& config, int tp_size,
                                                int tp_rank, int vocab_multiple = 1);

// Rows of the head's logits HeadForward computes at a time for a pass of `rows` rows: `configured`
// (DecoderModelOptions::head_chunk_rows) when positive, else automatic (see decoder_model.cc).
// Pure: the estimator uses it too.
int64_t HeadChunkRows(int64_t configured, int64_t rows, int d_model);

// The decoder's initialisation (decoder_params.cc), by each parameter's role ([Note: parameter
// roles]): GPT-2's weights normal(0, 0.02), its residual projections (attn.proj.weight,
// mlp.proj.weight) normal(0, 0.02 / sqrt(2 n_layer)), biases 0, norm gains 1; the LLaMA family's
// every linear and embedding weight normal(0, 0.02) (Hugging Face's _init_weights). Each value is
// a function of (seed, parameter name, element index) only: no dependence on world size, stage
// or the order units are initialised. A parameter that is not one of `config`'s fails a check.
Initializer DecoderInitializer(const DecoderConfig& config);

struct SamplingOptions {
  float temperature = 1.0f;  // 0: greedy (argmax)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  uint64_t seed = 1;
};
// Picks a token from one row of logits.
int32_t SampleToken(std::span<const double> logits, const SamplingOptions& options,
                    std::mt19937_64& rng);

class DecoderModel;

// DecoderStages: the model's stage primitives, what a pipeline schedule runs (PipelineExecutor)
// and what DecoderModel's whole-model passes run in order, with the state they share (this
// stage's units in the store, the kernels, the activations' allocator, the phase clocks). Made
// by DecoderModel::Create, reached through DecoderModel::stages().
class DecoderStages {
 public:
  const DecoderConfig& config() const { return options_.config; }
  const DecoderModelOptions& options() const { return options_; }

  // One micro-batch's activations live in a MicroBatch from Begin to its last backward (or its
  // head's forward, for evaluation). DecoderModel::ForwardBackward is Begin, EmbedForward,
  // BlocksForward(0, L), HeadForward, HeadBackward, BlocksBackward(0, L), EmbedBackward. The
  // tied embedding unit is opened by HeadForward and stays open until EmbedBackward (its
  // gradient has two parts).
  struct MicroBatch;
  struct MicroBatchDeleter {
    void operator()(MicroBatch* mb) const;
  };
  using MicroBatchPtr = std::unique_ptr<MicroBatch, MicroBatchDeleter>;
  StatusOr<MicroBatchPtr> Begin(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int batch, int seq, bool train);
  Status EmbedForward(MicroBatch& mb);
  Status BlocksForward(MicroBatch& mb, int first, int last);  // blocks [first, last)
  // Final LayerNorm, logits, loss (the mean cross-entropy; 0 without targets), in chunks of rows
  // (HeadChunkRows): a chunk's logits are computed, turned into the losses and, when training,
  // into their gradient x loss_scale, which goes at once into the head's weight gradient and the
  // final LayerNorm output's gradient; the [rows, vocab] logits never exist whole. The tied
  // embedding unit is opened for the backward when training.
  // `logits` (when given) gets rows logits_from_row .. of the logits, padding left out: only those
  // rows are computed, in one chunk, and a loss then needs logits_from_row = 0.
  StatusOr<double> HeadForward(MicroBatch& mb, float loss_scale, std::vector<double>* logits,
                               int64_t logits_from_row = 0);
  // The final LayerNorm's backward (the head's own ran in HeadForward).
  Status HeadBackward(MicroBatch& mb);
  // Blocks last-1 .. first. `dout` (a received gradient, BoundaryElements of act dtype) is the
  // gradient of block last-1's output when the head's backward did not produce it here; `dx`
  // (when given) receives the gradient of block first's input, to send on.
  Status BlocksBackward(MicroBatch& mb, int first, int last, const void* dout = nullptr,
                        void* dx = nullptr);
  Status EmbedBackward(MicroBatch& mb);
  // Pipeline boundaries: block `block`'s input (block - 1's output; the embedding's for 0), this
  // rank's rows of the residual stream, BoundaryElements of BoundaryDType. A stage receives a
  // chunk's input into it and sends a chunk's output from it.
  void* BlockInput(MicroBatch& mb, int block);
  int64_t BoundaryElements(const MicroBatch& mb) const;
  DType BoundaryDType() const;

  // Wall seconds in the forward and backward primitives (DecoderModel::phase_seconds).
  struct PhaseSeconds {
    double forward = 0;
    double backward = 0;
  };

 private:
  friend class DecoderModel;  // Create sets the units; the passes read the clocks and the loss
  DecoderStages(const DecoderModelOptions& options, WeightStore& store, ModelKernels& kernels,
                Allocator& activations);
  // `rows` rows of logits (this rank's columns, [rows, vocab / tp]) as [rows, vocab] host doubles,
  // gathered from every tensor-parallel rank, padding left out.
  Status CopyLogits(MicroBatch& mb, const Buffer& logits, int64_t rows, std::vector<double>* out);
  // The scratch of a micro-batch's backward (HeadBackward's, or the first BlocksBackward's on a
  // stage without the head).
  Status EnsureBackwardScratch(MicroBatch& mb);

  DecoderModelOptions options_;
  // This stage's units in the store: -1 when not held.
  int embedding_unit_ = -1, norm_unit_ = -1, head_unit_ = -1;  // head: untied models only
  std::vector<int> block_unit_;
  WeightStore& store_;
  ModelKernels& kernels_;
  Allocator& activations_;
  PhaseSeconds phase_seconds_;
  bool defer_training_loss_ = false;
};

class DecoderModel {
 public:
  // Declares the model's units in `store` (before the store is initialised).
  static StatusOr<std::unique_ptr<DecoderModel>> Create(const DecoderModelOptions& options,
                                                        WeightStore& store, ModelKernels& kernels,
                                                        Allocator& activations);
  ~DecoderModel();

  const DecoderConfig& config() const { return stages_->config(); }
  const DecoderModelOptions& options() const { return stages_->options(); }
  // The stage primitives the passes below run in order (a pipeline schedule runs them across
  // stages).
  DecoderStages& stages() { return *stages_; }
  // Wall seconds spent in the forward primitives (embedding, blocks, head) and the backward ones
  // since the last reset, gathers and reductions included (wall_clock_breakdown). On a GPU they are
  // the host's time to issue the work.
  using PhaseSeconds = DecoderStages::PhaseSeconds;
  const PhaseSeconds& phase_seconds() const { return stages_->phase_seconds_; }
  void ResetPhaseSeconds() { stages_->phase_seconds_ = {}; }
  // The model-wide position of each unit this rank holds, in the store's order (embeddings 0,
  // block l at 1 + l, the final norm at n_layer + 1): a pipeline stage holds some of them.
  std::vector<int> UnitPositions() const;

  // One micro-batch: tokens and targets are host int32 [batch, seq] with batch <= micro_batch
  // and seq <= seq_len. Adds the gradient of loss_scale x (mean cross-entropy) into the store's
  // gradient buffers and returns the mean cross-entropy.
  StatusOr<double> ForwardBackward(std::span<const int32_t> tokens,
                                   std::span<const int32_t> targets, int batch, int seq,
                                   float loss_scale);
  // With deferred training losses, ForwardBackward (and a training HeadForward) returns 0 and
  // adds the micro-batch's mean cross-entropy into the kernels' loss ledger in the stream's order
  // instead of copying its rows' losses to the host, which waits for the stream: a wait per
  // micro-batch that keeps the host from issuing ahead (on a GPU, a cudaStreamSynchronize
  // each). TakeTrainingLoss returns the sum since the last call (one wait) and zeroes it; the
  // sum is bitwise the per-call losses' on the CPU ([Note: the training loss ledger],
  // kernels/model_kernels.h). Evaluation's losses are read at once either way.
  void set_defer_training_loss(bool on) { stages_->defer_training_loss_ = on; }
  StatusOr<double> TakeTrainingLoss() { return stages_->kernels_.TakeLossLedger(); }
  // Forward only: the mean cross-entropy.
  StatusOr<double> Loss(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                        int batch, int seq);
  // Forward only: the logits [batch, seq, vocab] as host doubles.
  StatusOr<std::vector<double>> Logits(std::span<const int32_t> tokens, int batch, int seq);
  // Continues `prompt` by `new_tokens` tokens (the window slides once it exceeds seq_len).
  StatusOr<std::vector<int32_t>> Generate(std::vector<int32_t> prompt, int new_tokens,
                                          const SamplingOptions& sampling);

 private:
  explicit DecoderModel(std::unique_ptr<DecoderStages> stages);
  // The whole model on one micro-batch through the primitives; returns the mean loss when
  // targets are given.
  StatusOr<double> Run(std::span<const int32_t> tokens, std::span<const int32_t> targets, int batch,
                       int seq, bool train, float loss_scale, std::vector<double>* logits,
                       int64_t logits_from_row);

  std::unique_ptr<DecoderStages> stages_;
};

}  // namespace zerort
