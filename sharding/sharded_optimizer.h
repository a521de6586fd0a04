// ShardedOptimizer: the optimizer side of every unit — fp32 master, moments and gradient shard on
// the optimizer tier (device, host, or NVMe: DeepSpeed's offload_optimizer) — and what is done
// with them: gradient accumulation into the shards, the local part of the global norm, the step
// (fused AdamW / Adam / SGD kernels, writing the compute copy in the same pass), zeroing, and the
// state a checkpoint reads and writes, one unit at a time.
//
// Device and host tiers are updated in place by the kernels (on the CPU for the host tier). The
// NVMe tier streams: each unit's shard is cut in chunks of at most sub_group_size elements
// (a multiple of kReduceChunk), and chunk k is updated on the CPU while chunk k+1.. are read and
// chunk k-1 is written, through `buffer_count` staging sets. The norm of an NVMe gradient shard is
// taken when the shard is written during the backward (the last write of the step is the final
// value), so the step needs no extra pass over NVMe before its first update, clipping or not.
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "zerort/kernels/onebit.h"
#include "zerort/offload/staging_pool.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/span_sink.h"
#include "zerort/sharding/compressed_allreduce.h"
#include "zerort/sharding/sharded_unit.h"
#include "zerort/sharding/zero_one_schedule.h"

namespace zerort {

class HostGradientQueue;  // sharding/host_gradient_queue.h
class TaskPool;           // offload/task_pool.h

// Per-step scalars of the optimizer.
struct OptimizerStepArgs {
  float lr = 0.0f;
  int64_t step = 1;         // 1-based count of steps taken (skipped ones excluded)
  float grad_scale = 1.0f;  // 1 / (loss scale x micro-batches) x clip coefficient
};

// How a step's updates complete (ShardedOptimizer::Step).
enum class StepCompletion {
  kDone,     // every unit updated and its compute copy written
  kPerUnit,  // [Note: the host step behind the forward]: CompleteUnitStep(u) for each unit
};

// The fp32 shard buffers a checkpoint holds.
enum class StateKind { kMaster, kExpAvg, kExpAvgSq, kExpAvgSqFresh };

struct OptimizerResources {
  const ShardManagerOptions* options = nullptr;
  Communicator* dp = nullptr;
  Tiers tiers;
  Stream* compute = nullptr;
  OffloadStats* stats = nullptr;  // null: not counted
  // False on every tensor-parallel rank but the first: parameters replicated across the
  // tensor-parallel group (frame not split) are left out of this rank's norm, so the sum over
  // the model-parallel group counts them once.
  bool count_replicated = true;
  const SpanSink* span = nullptr;  // null or empty: no spans (ShardManager::Resources::span)
  // [Note: gradient sums on the device]: where a deferred step copies the sums to the host; null:
  // the compute stream.
  Stream* sums = nullptr;
  // The tensor-parallel group (null or one rank: none): LAMB's sums of split parameters
  // ([Note: LAMB with tensor parallelism]).
  Communicator* tp = nullptr;
};

// The NVMe tier's pipeline sizes (ShardedOptimizer's, and the memory model's): elements per chunk,
// given the largest shard, and bytes per staging set (master, two moments, gradient, compute
// values).
int64_t NvmeChunkNumel(const ShardManagerOptions& options, int64_t largest_shard);
int64_t NvmeStagingSetBytes(const ShardManagerOptions& options, int64_t chunk_numel);

class ShardedOptimizer {
 public:
  explicit ShardedOptimizer(const OptimizerResources& resources);
  ~ShardedOptimizer();

  // Allocates `unit`'s master, moments and gradient shard from its plan and sets the master to
  // `initial` (this rank's shard, host memory). Returns the master's values as a view the unit
  // initialises its compute copies from (the master itself in memory; `initial` for NVMe).
  StatusOr<TensorView> AddUnit(ShardedUnit& unit, std::span<const float> initial);
  // After every AddUnit: the staging sets of the NVMe pipeline, or 1-bit LAMB's buffers of the
  // rank (PlanRankBuffers).
  Status Finalize();

  // Adds a reduced gradient slice (reduce dtype, shard_numel elements, device memory written on
  // `stream`) into the unit's fp32 gradient shard. A host-tier shard fed from an asynchronous
  // stream is added later ([Note: host gradients in flight]): FinishHostGradients, which every
  // reader of the gradients here calls first, completes it.
  Status AccumulateGradient(const ShardedUnit& unit, const TensorView& reduced, Stream& stream);
  // Waits for the gradient copies in flight to the host tiers and adds them, oldest first.
  Status FinishHostGradients();
  // Adds this rank's sum of squares and count of non-finite values over every gradient shard,
  // unit by unit in order, into one-element f32 device views (zeroed by the caller).
  //
  // [Note: the norm taken by the last add]
  // Clipping needs the global norm before any update, so between the last backward and the host
  // step (on a GPU: what the next forward waits for, docs/gpu.md "The host step's bytes") sat a
  // pass over every in-memory host-tier gradient shard for its sum of squares: 4 bytes a
  // parameter, about 6 ms for GPT-2 124M at a host's 88 GB/s. The last add into a shard has its
  // values in cache: HostAccumulateWithSumOfSquares (kernels/reduce.h) adds and squares each
  // chunk in one go, bitwise the two passes' result. Which add is the last, no caller says (the
  // trainer, the pipeline executor, an embedder's loop), so each shard predicts it: the add that
  // brings this step's count to the step before's takes the norm part (every step of a steady run
  // from its second on; a tied unit added twice a micro-batch too). A wrong guess costs only
  // the pass: a later add, a write through GradShard (a tied unit's all-reduce) or a step with
  // fewer adds leaves norm_taken false and the pass runs as before. OffloadStats::norm_passes
  // counts the passes. The NVMe tier takes its parts on every write (AccumulateNvme).
  Status AccumulateNorm(const TensorView& sum_sq, const TensorView& nonfinite);
  // Leaves unit `u` out of this rank's norm (a tied copy another rank counts).
  void ExcludeFromNorm(int u);
  // Updates every unit's master and moments, and writes its compute copy; or, with a host-tier
  // AdamW, Adam or SGD (kPerUnit), starts the units' updates on a worker thread and returns.
  //
  // [Note: the host step behind the forward]
  // With the optimizer offloaded to the host, the device idles while the CPU updates every unit,
  // although the next forward needs only its first unit's weights to start. So the CPU step of
  // AdamW, Adam and SGD (element-wise given the global norm, which Step's caller has taken: no
  // collective inside the update) runs on a worker thread, unit by unit in registration order,
  // and Step returns at once (kPerUnit). Each unit is then completed by CompleteUnitStep(u), in
  // unit order, before anything reads its compute copy or state: ShardManager completes units
  // 0..u when unit u is first gathered (or prefetched) and every unit before the next step's
  // reduction and any checkpoint read or load, and refreshes each unit's compute copies there, so
  // the next forward's first units run on the device while the CPU updates the later ones (and
  // while units are pending, a prefetch completes at most one unit beyond those completed:
  // DeepSpeed's default prefetch bucket would otherwise ask for every unit at the first). The
  // worker also marks each unit's gradient shard zero after its update ([Note: host gradient
  // shards start stale]; the next backward writes into it only after the unit's forward has
  // completed it). Nothing changes in the arithmetic: the
  // same kernels on the same values in the same order, bitwise the synchronous step. On a GPU the
  // compute values go through pinned staging; the worker then runs at most kStagedAhead units
  // ahead of the completions (the staging is bounded) and a completion issues the unit's copy on
  // the compute stream ([Note: the host step's write-backs]); on a CPU run the worker writes the
  // compute copy itself and runs through every unit. Not deferred: LAMB and the 1-bit optimizers
  // (collectives per unit), the NVMe tier (its own pipelined step, nvme_step.h), the device tier
  // (its kernels are queued already), and overlap_host_step off; its default, kAuto, defers only
  // where the compute stream is asynchronous (a GPU, cpu-async): on the synchronous CPU device
  // the forward runs on the cores the update would take (measured there: no gain). Until
  // 2026-11-29 the step updated every unit before it returned, the device waiting: on an H200
  // GPT-2 124M trained at 94-109k tokens/s with the optimizer on the host, 175k on the device.
  StatusOr<StepCompletion> Step(const OptimizerStepArgs& args);
  // Completes the updates of a kPerUnit step through unit u, in unit order (waits for each, copies
  // its compute values to the device); a no-op for completed units or without a pending step.
  // ReadState and WriteState complete through their unit first.
  Status CompleteUnitStep(int u);
  // Zeroes every unit's gradient shard for the next step: on the device tier a fill; a host-tier
  // shard in memory is only marked.
  //
  // [Note: host gradient shards start stale]
  // A host-tier fp32 gradient shard used to be zero-filled after each step and every micro-batch's
  // slice added into it: a fill (4 bytes a parameter, one thread: 23 ms for GPT-2 124M here, on
  // the step worker's critical path in [Note: the host step behind the forward]) and a first add
  // that reads the zeros back (4 more). Now zeroing marks the shard stale, the step's first slice
  // writes it (AssignInto: 0 + x, so that -0 lands as +0, bitwise what the add into zeros gave)
  // and later slices add; a reader that comes before any slice (a unit that got no gradient this
  // step: the norm, the update, a tied unit's all-reduce, GradShard) zero-fills it first
  // (GradView). The marks are ordered as the shards are: set by the step's thread or the step
  // worker, read by the thread adding slices only after the unit's step is completed. The NVMe
  // tier's grad_written does the same for a shard on disk; the device tier's fill is a kernel on
  // the compute stream and stays.
  Status ZeroGradients();
  // The 1-bit optimizers: zeroes every unit's compression errors, 0/1 Adam's accumulated local
  // steps and 1-bit LAMB's fused momentum (after a checkpoint load, as DeepSpeed resets them).
  Status ResetCompressionErrors();
  // Whether step `step` (1-based) all-reduces the gradients: not 1-bit Adam's or 1-bit LAMB's
  // compressed steps, not 0/1 Adam's steps that compress the gradient or take local steps.
  bool ReducesGradients(int64_t step);
  // The optimizer's own step counters (0/1 Adam's schedule) at `steps` taken: a resume
  // (ShardManagerState::RestoreCounters, the one place the step count is set).
  void RestoreSchedule(int64_t steps);

  // 1-bit LAMB's scalars of unit u's parameters, in layout order ([Note: 1-bit LAMB]; empty for
  // every other optimizer): a checkpoint saves and restores them.
  std::span<OneBitLambParam> LambParams(int u);

  bool HasState(StateKind kind) const;
  // This rank's shard of `kind` of unit `u` (shard_numel values, padding included).
  Status ReadState(int u, StateKind kind, std::span<float> out);
  // Overwrites it (the unit's compute copy is the caller's: ShardManager::LoadState).
  Status WriteState(int u, StateKind kind, std::span<const float> values);
  // The fp32 gradient shard of unit `u`, when it is in memory (tests, inspection, a tied unit's
  // all-reduce): the caller may write it, so the norm reads it again ([Note: the norm taken by
  // the last add]).
  TensorView GradShard(int u);
  // Where unit u's master and moments live: the optimizer's placement, or the device for the
  // first units of a partial offload ([Note: partial optimizer offload]).
  MemoryTier tier(int u) const;
  // Where work on unit u's gradient shard (GradShard) is ordered: StreamFor its tier.
  Stream* GradStream(int u) const { return StreamFor(grad_tier(u)); }

 private:
  struct UnitState;
  // Where its gradient shard lives: tier(u), or the device ([Note: gradient sums on the device]).
  MemoryTier grad_tier(int u) const;
  // Where work on a buffer of `t` is ordered: the device tier's in the compute stream (CUDA
  // kernels, and the CPU device's, queued there on cpu-async); the host tiers' on the host, after
  // the synchronisation that hands them their data (null). By tier, not by device: on a CPU run
  // the device tier is host memory too, and still the streams'.
  Stream* StreamFor(MemoryTier t) const {
    return t == MemoryTier::kDevice ? resources_.compute : nullptr;
  }
  // The placement's tier: every unit's, but the device-tier units of a partial offload.
  MemoryTier placement() const { return resources_.options->placement.optimizer; }
  struct Chunk {
    int unit;
    Range range;  // in the shard frame
  };
  class NvmeStep;  // the NVMe tier's pipelined step (nvme_step.h)
  // [Note: the host step's write-backs] On a GPU a host-tier unit's updated compute values go to
  // the device from pinned staging by an asynchronous copy on the compute stream (which the next
  // gathers and the forward follow), so the copy of one unit overlaps the CPU update of the next;
  // at most kWriteBacksInFlight staged units are held, and the step returns once every copy has
  // landed (a failure part-way still waits for the copies issued before the staging goes).
  struct WriteBack {
    ::zerort::Buffer staged;
    std::unique_ptr<Event> copied;
  };
  class WriteBacks;
  static constexpr size_t kWriteBacksInFlight = 2;
  struct DeferredStep;  // [Note: the host step behind the forward]
  static constexpr int kStagedAhead = 4;
  Status StepInMemory(int u, const OptimizerStepArgs& args, WriteBacks& write_backs);
  // Where unit u's update writes its compute values: the compute copy itself, or (a copy on
  // another device) `staged`, allocated here. Empty when the unit has no compute copy of its own.
  StatusOr<TensorView> UpdateTarget(int u, ::zerort::Buffer* staged);
  // The optimizer's update of unit u's in-memory state from the gradient `grad` (GradView(u), or
  // its staged copy: StageGradient), the compute values written to `out`.
  Status UpdateUnit(int u, const OptimizerStepArgs& args, const TensorView& out,
                    const TensorView& grad);
  // [Note: gradient sums on the device]: whether unit u's update reads a gradient summed on the
  // device (a host-tier unit whose gradient shard is there).
  bool GradOnDevice(int u) const;
  // Copies that gradient into `staged` (allocated here, on the host: pinned on a GPU) on
  // `stream`, then queues the device shard's zero fill there when `then_zero`; returns the staged
  // values' view, valid once `stream` has run the copy.
  StatusOr<TensorView> StageGradient(int u, ::zerort::Buffer* staged, Stream& stream,
                                     bool then_zero);
  // Where a deferred step stages them: a stream of their own (OptimizerResources::sums), so that
  // the next forward's kernels do not queue behind the copies, or the compute stream.
  Stream& SumsStream() const { return resources_.sums ? *resources_.sums : *resources_.compute; }
  // Copies `staged` into unit u's compute copy on the compute stream, then frees the staging of
  // the copies that have landed, waiting while more than `keep` are in flight.
  Status IssueWriteBack(int u, ::zerort::Buffer staged, WriteBacks& write_backs, size_t keep);
  // `fill_device` false: the device shard's fill is queued already (a deferred step's
  // StageGradient); only the unit's gradient bookkeeping is reset.
  Status ZeroGradient(int u, bool fill_device = true);
  bool DefersStep() const;
  // Host-tier units a deferred step's worker may run ahead of the completions: kStagedAhead when
  // their compute values go through staging, else all.
  int Ahead() const;
  // Submits the update of the next host-tier unit from `deferred_->submitted` to the step worker
  // (device-tier ones are passed over: Step updated them); none when every unit is submitted.
  Status SubmitDeferred();
  // Completes unit `deferred_->completed` and submits the next update.
  Status CompleteNext();
  Status StepNvme(const OptimizerStepArgs& args);
  // The fused kernel on one range of unit u, given fp32 views of that range and the compute out.
  // LAMB over a unit's in-memory shard: moments and updates per parameter piece, the pieces'
  // sums of p^2 and update^2 summed over the data-parallel group (a parameter's norm spans its
  // shards) and, for split parameters, the tensor-parallel group, then each parameter's trust
  // ratio applied.
  // 1-bit LAMB's warm-up passes `onebit`: its parameters' frozen coefficients, averaged.
  Status UpdateLamb(int u, const OptimizerStepArgs& args, const TensorView& master,
                    const TensorView& grad, const TensorView& exp_avg, const TensorView& exp_avg_sq,
                    const TensorView& out, std::span<OneBitLambParam> onebit = {});
  // 1-bit LAMB ([Note: 1-bit LAMB]): before the units' updates of a compressed step, the
  // scaling coefficients (the first time), every unit's momentum into the fused buffer and its
  // compressed mean; then per unit the warm-up's LAMB or the compressed step's update.
  Status CompressLambMomentum(const OptimizerStepArgs& args);
  Status SetLambScaling();
  Status UpdateOneBitLamb(int u, const OptimizerStepArgs& args, const TensorView& out);
  // `n` zeroed fp32 values of workspace on the optimizer's device.
  StatusOr<::zerort::Buffer> DeviceWorkspace(int64_t n, Stream* stream);
  // 1-bit Adam over a unit's in-memory state, in the phase of args.step ([Note: 1-bit Adam]).
  Status UpdateOneBit(int u, const OptimizerStepArgs& args, const TensorView& out);
  // 0/1 Adam over a unit's in-memory state, in the schedule's step ([Note: 0/1 Adam]).
  Status UpdateZeroOne(int u, const OptimizerStepArgs& args, const ZeroOneStep& plan,
                       const TensorView& out);
  // One of OneBitAdamStep's phases over every parameter piece of unit u (each with its decay).
  Status EachPiece(int u, const OptimizerStepArgs& args, OneBitPhase phase, float grad_scale,
                   const TensorView& out);
  // The unit's compressed all-reduce of `values` (its flat fp32 momentum, gradient or
  // accumulator) over the data group, when it has more than one rank.
  Status CompressedMean(int u, const TensorView& values, const char* what);
  Status ZeroErrors(bool accumulators);
  Status Update(int u, const Range& range, const OptimizerStepArgs& args, const TensorView& master,
                const TensorView& grad, const TensorView& exp_avg, const TensorView& exp_avg_sq,
                const TensorView& out);
  Status AccumulateNvme(int u, const TensorView& reduced_host);
  // Adds a reduced slice in host memory into unit u's host or NVMe gradient shard.
  Status AddHostGradient(int u, const TensorView& host);
  // Unit u's in-memory gradient shard to read, zero-filled first if it is stale ([Note: host
  // gradient shards start stale]).
  TensorView GradView(int u);
  // The oldest gradient in flight to the host tiers, once its copy is done, added.
  // The ranges of unit u's shard that enter this rank's norm: all of it, or without the
  // pieces of replicated parameters (count_replicated false).
  std::vector<Range> NormRanges(int u) const;
  // out += sum of squares of `grad` (the unit's whole shard, or the part at `offset` of it)
  // over NormRanges(u).
  Status SumOfSquaresOfNormRanges(int u, const TensorView& grad, int64_t offset,
                                  const TensorView& out, Stream* stream) const;
  PlacedBuffer* Buffer(int u, StateKind kind);
  int IndexOf(const ShardedUnit& unit) const;

  OptimizerResources resources_;
  std::vector<std::unique_ptr<UnitState>> units_;
  std::unordered_map<const ShardedUnit*, int> index_;
  int64_t chunk_numel_ = 0;                    // NVMe pipeline chunk
  std::unique_ptr<StagingPool> staging_;       // NVMe pipeline staging sets
  std::unique_ptr<OneBitAllReduce> onebit_;    // 1-bit Adam's compressed all-reduce
  std::unique_ptr<ZeroOneSchedule> zero_one_;  // 0/1 Adam's counters
  // 1-bit LAMB: the rank's fused momentum and its errors (PlanRankBuffers), and where each
  // unit's parameters start in it.
  PlacedBuffer fused_, fused_worker_error_, fused_server_error_;
  std::vector<int64_t> fused_at_;
  double lrs_ = 0;  // 0/1 Adam: the learning rates summed over the local steps since the last sync
  ZeroOneStep zero_one_step_;  // 0/1 Adam: the step being taken
  // [Note: host gradients in flight] (host_gradient_queue.h, internal to sharding/): made by the
  // first host-tier slice.
  std::unique_ptr<HostGradientQueue> host_grads_;
  // [Note: the host step behind the forward]: the last deferred step (kept until the next step,
  // with its write-backs in flight) and its worker, made by the first; the worker is destroyed
  // (its tasks run, joined) before the step and the units its tasks use.
  std::unique_ptr<DeferredStep> deferred_;
  std::unique_ptr<TaskPool> step_worker_;
};

}  // namespace zerort
