// The memory model's replay of a step (memory_model.h, [Note: bytes per step] in comm_model.h):
// the units as the runtime lays them out and plans them, and StepModel, which allocates, uses and
// frees every buffer the runtime would, in its order. Internal to engine/.
#pragma once

#include "zerort/estimate/memory_model.h"
#include "zerort/estimate/memory_replay.h"
#include "zerort/kernels/quantize.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/sharding/flat_layout.h"
#include "zerort/sharding/gather_planner.h"
#include "zerort/sharding/reduce_plan.h"
#include "zerort/sharding/unit_plan.h"

namespace zerort::memory_internal {

using Cat = MemoryCategory;
using Tier = MemoryTier;

struct Unit {
  FlatLayout layout;
  UnitPlan plan;
  bool persistent = false;
  bool gathered = false;         // stage 3: a gathered buffer exists (gathering or unsharded)
  bool secondary_valid = false;  // [Note: hpZ]: this step's weights in the secondary copy
  Replay::Handle gathered_buffer, full_grad;
  // [Note: gradient sums on the device]: the sum staged to the host for a deferred update, held
  // until the unit's completion (its first use in the next forward).
  Replay::Handle grad_staged;
};

// What one pipeline stage holds (the whole model without pipeline parallelism), as unit indexes.
struct StageUnits {
  int embedding = -1;       // the first stage's input embedding, the last stage's tied head
  int norm = -1;            // the final LayerNorm, on the last stage
  int head = -1;            // an untied output projection (LLaMA), on the last stage
  std::vector<int> blocks;  // in model order
  DecoderStagePart part;    // the blocks and ends the stage holds, as the runtime splits them
  bool first = true, last = true;
  int live = 1;           // micro-batches whose activations the stage holds at once
  int head_live = 1;      // of them, between their head's forward and backward (the last stage)
  int backward_live = 1;  // of them, between their first backward and their last (its scratch)
  int live_sets = 0;  // block activation sets held at once (chunks between forward and backward)
};

class StepModel {
 public:
  StepModel(const MemoryModelInput& in, std::vector<Unit> units, StageUnits stage,
            MemoryEstimate& out, bool model_states_only = false)
      : in_(in),
        options_(in.manager),
        units_(std::move(units)),
        st_(std::move(stage)),
        out_(out),
        r_(model_states_only),
        pending_(in.manager.reduce_bucket_size),
        activation_terms_(model_states_only),
        planner_(GatherBudgets::From(in.manager), UnitInfos(units_)) {
    // The runtime's streams: the manager's compute and comm streams (comm is compute without
    // overlap_comm); the kernels (CPU and CUDA) issue on compute, so their buffers are its.
    compute_stream_ = *CreateStream(Device::Cpu(), "compute");
    comm_stream_ = *CreateStream(Device::Cpu(), "comm");
    compute_ = compute_stream_.get();
    comm_ = in.manager.overlap_comm ? comm_stream_.get() : compute_;
  }

  void Run();

 private:
  int64_t csize() const { return static_cast<int64_t>(DTypeSize(in_.compute())); }
  KernelBackend backend() const { return in_.cuda ? KernelBackend::kCuda : KernelBackend::kCpu; }
  static constexpr int64_t kRsize = 4;  // reduce dtype fp32
  // Under pipeline parallelism stages 2-3 reduce once per step (ShardManagerOptions).
  bool reduce_at_step() const { return in_.pp > 1; }
  int64_t GatheredBytes(const Unit& u) const { return u.layout.padded_numel() * csize(); }
  void Term(Tier tier, Cat cat, std::string what, std::string formula, int64_t bytes) {
    out_.terms.push_back({tier, cat, std::move(what), std::move(formula), bytes});
  }

  void Init();
  void MicroBatch();
  void Step();
  void Ensure(int u);
  // As ShardManager::SettleThrough ([Note: the host step behind the forward]): units settled_..u
  // refreshed after a deferred step (stages 1-2: their updated shards all-gathered).
  void SettleThrough(int u);
  void RefreshUpdated(const Unit& u);
  void Open(int u, bool backward);
  void Close(int u, bool backward);
  void ReducerAdd(int u);
  void Flush();
  void Reduce(const ReducePlan& plan, const std::vector<int>& dropped);
  std::vector<ReduceSizes> Sizes(const std::vector<int>& units) const;
  ReduceGroups Groups() const { return {in_.shard_ranks(), in_.replicas()}; }
  void QuantizedReduceScatter(int64_t bucket_shard);
  void OneBitCompressedStep();
  void UnitUpdates();
  // 1-bit LAMB's fused momentum: the parameters' elements of every unit (stage 0).
  int64_t OneBitLambNumel() const;
  void AttentionScratch(bool backward);
  GatherPlanner::Resident Resident() const {
    return [this](int u) { return units_[u].gathered; };
  }
  static std::vector<GatherPlanner::UnitInfo> UnitInfos(const std::vector<Unit>& units) {
    std::vector<GatherPlanner::UnitInfo> infos;
    for (const Unit& u : units) infos.push_back({u.layout.padded_numel(), u.plan.persistent});
    return infos;
  }

  // Buffers taken in order on `stream` and given back at once (a collective's scratch).
  void Transient(Cat cat, std::initializer_list<int64_t> bytes, Stream* stream) {
    std::vector<Replay::Handle> held;
    for (int64_t b : bytes) held.push_back(r_.Alloc(cat, b, stream));
    for (auto& h : held) r_.Free(h);
  }
  // [Note: bytes per step]: a collective over the shard group, and one across the replicas.
  void InGroup(CollectiveOp op, int64_t bytes) {
    out_.comm.Add(op, bytes, in_.shard_ranks(), in_.ShardGroupCrossesNodes());
  }
  void AcrossReplicas(int64_t bytes) {
    out_.comm.Add(CollectiveOp::kAllReduce, bytes, in_.replicas(), in_.ReplicasCrossNodes());
  }
  // A unit's all-gather: its buffer on the comm stream, then read on the compute stream.
  // [Note: hpZ]: from the secondary copy once the step's first gather made it; qwZ packs each
  // rank's shard as int8 (buffers taken after the gathered one, as ShardedUnit::GatherQuantized).
  Replay::Handle Gather(Unit& u) {
    Replay::Handle h = r_.Alloc(Cat::kGatheredWeights, GatheredBytes(u), comm_);
    if (u.secondary_valid) {
      out_.comm.Add(CollectiveOp::kAllGather, GatheredBytes(u), in_.manager.hpz_partition_size,
                    in_.SecondaryCrossesNodes());
    } else if (in_.manager.quantized_weights && !u.plan.persistent) {
      const int64_t packed = QuantizedBytes(u.layout.shard_numel());
      InGroup(CollectiveOp::kAllGather, packed * in_.shard_ranks());
      Transient(Cat::kCommBuffers, {packed, packed * in_.shard_ranks()}, comm_);
    } else {
      InGroup(CollectiveOp::kAllGather, GatheredBytes(u));
    }
    if (!u.secondary_valid) u.secondary_valid = u.plan.Has(UnitBuffer::kSecondary);
    r_.Use(h, *compute_);
    return h;
  }

  const MemoryModelInput& in_;
  const ShardManagerOptions options_;
  std::unique_ptr<Stream> compute_stream_, comm_stream_;
  Stream* compute_ = nullptr;
  Stream* comm_ = nullptr;
  std::vector<Unit> units_;
  // [Note: the host step behind the forward]: whether the step is deferred (on a GPU: the
  // estimate's compute stream is asynchronous there only), and units [0, settled_) refreshed.
  // After units_: a partial offload with no unit on the host defers nothing.
  const bool defers_ = DefersHostStep(in_.manager, in_.cuda, static_cast<int>(units_.size()));
  int settled_ = 1 << 30;
  const StageUnits st_;
  MemoryEstimate& out_;
  Replay r_;
  ReduceBucket<int> pending_;  // stages 2-3 ([Note: the reduce plan])
  std::vector<Replay::Handle> persistent_;
  bool activation_terms_;  // written (or, in cold mode, never to be written)
  // The shard manager's recorded order, prefetch and keeps ([Note: the gather plan]): the first
  // step records, the second (the one measured) replays.
  GatherPlanner planner_;
};

}  // namespace zerort::memory_internal
