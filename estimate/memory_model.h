// MemoryModel: the bytes a training step of the GPT model takes, per rank, per tier and per
// category, predicted by replaying the runtime's allocations in program order through the
// runtime's CachingAllocator (over a backend that maps address space, no memory) into a
// MemoryTracker (the class that accounts the real run): in-use and reserved peaks (allocator
// overhead included) mean the same thing in both.
//
// The replay is built from the same code the runtime runs: FlatLayout for every unit (padding,
// shard sizes), DecoderUnits for the parameter list, the ShardManager's gather/prefetch budgets and
// bucketing rules, and the GPT model's activation set (layers/README.md). What it replays, in
// order, on the streams the runtime uses (a step that records the unit order first, then the
// measured steady-state step, when prefetch follows the recorded order):
//   init:     per unit master, moments, gradient shard, compute copy or shard, full gradient
//             (stages 0-1), gathered buffer of persistent stage-3 units; CUDA: cuBLASLt workspace
//   per micro-batch: token buffers, per-block activation sets (one with checkpointing), block
//             outputs, gathers and releases with prefetch (stage 3), logits, the backward scratch,
//             full gradients and reduce-scatter buckets (stages 2-3), CUDA attention scratch
//   step:     all-reduce buckets (stages 0-1), the norm accumulator
// Which buffer lives where comes from sharding's UnitPlan, the runtime's own: offload moves the
// master, moments and gradient shard (offload_optimizer) or the stage-3 compute shard
// (offload_param) to the host or NVMe tier, and adds the staging pools the runtime allocates;
// tensor parallelism divides the split dimensions of the weights and the per-head activations;
// pipeline parallelism models one stage: its blocks (StageChunks, the runtime's split), the
// embedding on the first and last stage (the last one's is the tied twin), the final norm and head
// on the last; the activation sets of as many micro-batches as the stage's schedule holds at once
// (PipelineLiveMicroBatches of the runtime's own action list: GPipe m, 1F1B p - s, interleaved
// more), the head's logits of each on the last stage, and at ZeRO-2/3 every full gradient kept
// until the step (one reduction per step). EstimateMemoryPerStage and MaxOverStages give the
// maximum over the stages, per category, as the busiest rank sees it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zerort/config/config.h"
#include "zerort/estimate/comm_model.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/memory.h"
#include "zerort/sharding/options.h"

namespace zerort {

struct MemoryModelInput {
  DecoderConfig model;
  int micro_batch = 1;
  int accumulation = 1;
  int dp = 1;  // data-parallel ranks
  // Hybrid sharding ([Note: hybrid sharding]): the ranks the state is sharded over; 0: all dp.
  int data_shard = 0;
  int shard_ranks() const { return data_shard > 0 && data_shard < dp ? data_shard : dp; }
  int replicas() const { return dp / shard_ranks(); }
  // Whether this stage's shard group and its replicate group span nodes (comm_model.h).
  bool ShardGroupCrossesNodes() const;
  bool ReplicasCrossNodes() const;
  bool SecondaryCrossesNodes() const;  // hpZ's group of manager.hpz_partition_size ranks
  int tp = 1;                          // tensor-parallel size
  bool sequence_parallel = false;
  int vocab_multiple = 1;  // make_vocab_size_divisible_by
  int pp = 1;              // pipeline-parallel size
  int pipeline_stage = 0;  // which stage this estimate is of (0 .. pp-1)
  std::string pipeline_schedule = "1f1b";
  int virtual_stages = 1;
  std::vector<int> pipeline_layers;  // blocks per chunk; empty: an even split
  // Ranks per node, placed node by node: the per-node host column, and which groups' bytes cross
  // nodes ([Note: bytes per step], estimate/comm_model.h).
  int ranks_per_node = 1;
  bool activation_checkpointing = false;
  int64_t head_chunk_rows = 0;  // DecoderModelOptions::head_chunk_rows
  bool cuda = false;            // CUDA kernels keep a cuBLASLt workspace and attention scratch
  // model.attention_backend: the attention program asked for on CUDA; nullopt: by shape
  // (AttentionProgramFor, kernels/memory_facts.h).
  std::optional<AttentionProgram> attention;
  // model.flash_attention: the flash kernels' block shapes. They change no byte the model counts;
  // Validate refuses what a run on CUDA would (CheckAttentionBackend).
  FlashTiles flash_tiles;
  // The shard manager the run creates (FromConfig: config/run_options.h, as `zerort train` builds
  // it): stage, compute dtype, optimizer, placement, offload sizes, bucket, prefetch and keep
  // budgets. Its stage defaults to 0 here.
  ShardManagerOptions manager = StageZero();

  int stage() const { return static_cast<int>(manager.stage); }
  DType compute() const { return manager.compute_dtype; }
  // fp32 optimizer states per parameter: Adam(W) and Lamb 2, SGD with momentum 1, SGD 0.
  int optimizer_states() const;
  // A layout of `estimate`'s tables and the preflight's suggestions: the stage, and "none",
  // "cpu" (pinned) or "nvme" for the optimizer state (and the parameters at stage 3).
  void SetLayout(int zero_stage, const std::string& offload);

  // From a run config on `world_size` ranks: data-parallel size world / (tensor x pipeline
  // size) (the batch triple resolved there); stage 0.
  static StatusOr<MemoryModelInput> FromConfig(const RunConfig& config, int world_size, bool cuda);
  Status Validate() const;
  // Cold mode: this layout on a token-sized model of `blocks` blocks, one stage, no tensor split
  // (the activation replay then runs but is not recorded).
  MemoryModelInput WithoutShape(int blocks) const;

 private:
  static ShardManagerOptions StageZero() {
    ShardManagerOptions o;
    o.stage = ZeroStage::k0;
    return o;
  }
};

// One term of the estimate, for --explain.
struct MemoryTerm {
  MemoryTier tier;
  MemoryCategory category;
  std::string what;     // "master shards (fp32)"
  std::string formula;  // "sum over units of shard_numel x 4 B"
  int64_t bytes = 0;    // the term's size (per occurrence)
};

struct MemoryEstimate {
  MemorySnapshot peaks;  // current = 0 after the step; peaks per tier x category
  std::array<int64_t, kNumMemoryTiers> phase_forward{}, phase_backward{}, phase_step{};
  std::vector<MemoryTerm> terms;
  int64_t parameters = 0;  // model parameters on this rank (after tp/pp split)
  StepComm comm;           // bytes this rank sends per step, by link ([Note: bytes per step])

  int64_t Peak(MemoryTier tier, MemoryCategory category) const {
    return peaks.Get(tier, category).peak;
  }
  int64_t PeakTotal(MemoryTier tier) const { return peaks.in_use[static_cast<int>(tier)].peak; }
  // Bytes the caching allocator holds at its peak (in use plus cached and rounding).
  int64_t PeakReserved(MemoryTier tier) const {
    return peaks.reserved[static_cast<int>(tier)].peak;
  }
};

StatusOr<MemoryEstimate> EstimateMemory(const MemoryModelInput& input);
// Every pipeline stage's estimate (one without pipeline parallelism).
StatusOr<std::vector<MemoryEstimate>> EstimateMemoryPerStage(const MemoryModelInput& input);
// Per tier and category the largest peak of `snapshots` (each stage's, or each rank's measured):
// what the busiest rank needs of each. The totals are the largest totals.
MemorySnapshot MaxOverStages(const std::vector<MemorySnapshot>& snapshots);

// Cold mode (zerort estimate --params P --largest-layer-params L, as DeepSpeed's cold estimators
// take them): the units of a GPT-2-style decoder of exactly P parameters whose largest unit holds
// exactly L. The largest layer is the tied embedding ((50257 + 1024) x d, d = L / 51281) when a
// block of that d (12 d^2 + 13 d) is no larger, else a block (the d whose block is L, the
// embedding (50257 + 1024) x d); the other units are blocks of that size, the rest of P in one
// smaller block, and a final norm of 2 d. GPT shapes are fitted back to their own units.
struct ColdDecoder {
  int64_t d = 1;
  bool embedding_largest = true;
  std::vector<int64_t> units;  // parameters: the embedding, the blocks, the norm (if any)
  int blocks = 0;
  bool has_norm = false;
};
StatusOr<ColdDecoder> FitColdDecoder(int64_t params, int64_t largest);

// What zerort's runtime keeps for those model states on one rank of `layout` (its stage, data-
// parallel size, dtype, offload and bucket options; its model is ignored): the memory model's
// replay of a steady-state step over the FitColdDecoder units (UnitPlan's buffers, gathers and
// prefetch, gradient buckets, offload staging), without activations or workspace, which need the
// shape.
StatusOr<MemoryEstimate> EstimateColdModelStates(const MemoryModelInput& layout, int64_t params,
                                                 int64_t largest);

// The ZeRO paper's model-state accounting (Rajbhandari et al. 2020, section 5): Psi parameters,
// mixed precision with K bytes of optimizer state per parameter (12 for Adam), N ranks:
// stage 0: (2 + 2 + K) Psi; 1: 2 Psi + 2 Psi + K Psi / N; 2: 2 Psi + (2 + K) Psi / N;
// 3: (2 + 2 + K) Psi / N. Bytes per rank.
double ZeroPaperModelStates(double params, int ranks, int stage, double k = 12);

}  // namespace zerort
