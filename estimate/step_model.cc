// The memory model's replay of a step (step_model.h).
#include "zerort/estimate/step_model.h"

#include "zerort/sharding/compressed_allreduce.h"

#include <algorithm>
#include <map>
#include <utility>
#include "zerort/estimate/memory_replay.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/quantize.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/layers/pipeline_schedule.h"
#include "zerort/layers/tp_layers.h"
#include "zerort/offload/staging_pool.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/flat_layout.h"
#include "zerort/sharding/gather_planner.h"
#include "zerort/sharding/sharded_optimizer.h"
#include "zerort/sharding/unit_plan.h"

namespace zerort::memory_internal {
// As ShardManager::Create and Initialize: the parameter fetch pool, then per unit the buffers of
// its plan with a persistent lifetime, in plan order (optimizer side, then parameter side), with
// the transient host buffers an NVMe write of initial values takes; then the NVMe pipeline's
// staging sets.
void StepModel::Init() {
  const ShardPlacement& at = options_.placement;
  const Tier host_tier =
      at.optimizer == Tier::kHost || at.params == Tier::kHost ? Tier::kHost : Tier::kPinnedHost;
  auto transient = [&](int64_t bytes) {  // staging of an initial NVMe write
    Replay::Handle h = r_.Alloc(Cat::kStaging, bytes, nullptr, host_tier);
    r_.Free(h);
  };
  if (at.params == Tier::kNvme) {
    int64_t largest_offloaded = 0;
    for (const Unit& u : units_) {
      if (!u.plan.persistent)
        largest_offloaded = std::max(largest_offloaded, u.layout.shard_numel());
    }
    const int64_t bytes = StagingPool::AllocationBytes(
        in_.manager.offload.param_buffer_count,
        static_cast<size_t>(ParamFetchBufferNumel(options_, largest_offloaded) * csize()));
    persistent_.push_back(r_.Alloc(Cat::kStaging, bytes, nullptr, host_tier));
    Term(host_tier, Cat::kStaging, "parameter fetch buffers (offload_param nvme)",
         "buffer_count x min(buffer_size, largest offloaded shard) x compute bytes", bytes);
  }
  // Per tier and category: the kinds of buffer (each named once, in the order met), how many
  // units hold one, and their bytes.
  struct Sum {
    std::vector<UnitBuffer> kinds;
    int64_t units = 0;
    int64_t bytes = 0;
    const Unit* last = nullptr;  // the unit that added last (none for the rank's own buffers)
    void Add(UnitBuffer kind, int64_t b, const Unit* unit) {
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
      bytes += b;
      if (unit != nullptr && unit != std::exchange(last, unit)) ++units;
    }
  };
  std::map<std::pair<Tier, Cat>, Sum> sums;
  int64_t gathered = 0, largest_shard = 0;
  for (Unit& u : units_) {
    u.persistent = u.plan.persistent;
    largest_shard = std::max(largest_shard, u.layout.shard_numel());
    for (const PlannedBuffer& b : u.plan.buffers) {
      if (b.lifetime != Lifetime::kPersistent) continue;
      if (b.buffer == UnitBuffer::kGathered) {
        u.gathered_buffer = Gather(u);
        u.gathered = true;
        gathered += b.bytes();
        continue;
      }
      persistent_.push_back(r_.Alloc(b.category, b.bytes(), compute_, b.tier));
      sums[{b.tier, b.category}].Add(b.buffer, b.bytes(), &u);
      // The master's and the compute shard's initial values go to NVMe through a host buffer.
      if (b.tier == Tier::kNvme &&
          (b.buffer == UnitBuffer::kMaster || b.buffer == UnitBuffer::kComputeShard)) {
        transient(AlignedAllocationBytes(b.bytes()));
      }
    }
  }
  // 1-bit LAMB's buffers of the rank, after the units' (ShardedOptimizer::Finalize).
  for (const PlannedBuffer& b : PlanRankBuffers(options_, OneBitLambNumel(), in_.shard_ranks())) {
    persistent_.push_back(r_.Alloc(b.category, b.bytes(), compute_, b.tier));
    sums[{b.tier, b.category}].Add(b.buffer, b.bytes(), nullptr);
  }
  for (const auto& [key, sum] : sums) {
    // One line per tier and category: which kinds of buffer, summed over the units holding them
    // (the rank's own 1-bit LAMB buffers are in no unit).
    std::string names;
    for (UnitBuffer kind : sum.kinds)
      StrAppend(&names, names.empty() ? "" : ", ", UnitBufferName(kind));
    if (sum.units > 0) StrAppend(&names, " (", sum.units, sum.units == 1 ? " unit)" : " units)");
    Term(key.first, key.second, names,
         "sum over units of the planned buffers (sharding/unit_plan.h)", sum.bytes);
  }
  if (gathered > 0) {
    Term(Tier::kDevice, Cat::kGatheredWeights, "persistent units, always gathered",
         "units below stage3_param_persistence_threshold: padded_numel x compute bytes", gathered);
  }
  if (at.optimizer == Tier::kNvme) {
    const int64_t chunk = NvmeChunkNumel(options_, largest_shard);
    const int64_t bytes =
        StagingPool::AllocationBytes(std::max(in_.manager.offload.optimizer_buffer_count, 2),
                                     static_cast<size_t>(NvmeStagingSetBytes(options_, chunk)));
    persistent_.push_back(r_.Alloc(Cat::kStaging, bytes, nullptr, host_tier));
    Term(host_tier, Cat::kStaging, "optimizer chunk staging sets (offload_optimizer nvme)",
         "buffer_count x (4 x chunk x 4 B + chunk x compute bytes), chunk <= sub_group_size",
         bytes);
  }
  if (in_.cuda) {
    persistent_.push_back(r_.Alloc(Cat::kWorkspace, kCudaModelWorkspaceBytes, compute_));
    Term(Tier::kDevice, Cat::kWorkspace, "cuBLASLt workspace and the loss ledger", "32 MiB + 256 B",
         kCudaModelWorkspaceBytes);
  }
}

// As ShardManager::EnsureGathered, Prefetch and EndScope: the planner decides.
void StepModel::Ensure(int u) {
  SettleThrough(u);
  Unit& unit = units_[u];
  planner_.BeginUse(u);
  if (!unit.persistent && !unit.gathered) {
    unit.gathered_buffer = Gather(unit);
    unit.gathered = true;
  }
  const int limit = settled_;  // as ShardManager::Prefetch: one unit beyond the settled ones
  for (int p : planner_.Prefetch(Resident())) {
    if (p > limit) break;
    SettleThrough(p);
    units_[p].gathered_buffer = Gather(units_[p]);
    units_[p].gathered = true;
  }
}

void StepModel::SettleThrough(int u) {
  for (; settled_ <= u && settled_ < static_cast<int>(units_.size()); ++settled_) {
    r_.Free(units_[settled_].grad_staged);  // as ShardedOptimizer::CompleteNext
    RefreshUpdated(units_[settled_]);
  }
}

// As ShardedUnit::GatherUpdated: stages 1-2 all-gather the updated shards (or broadcast them), a
// unit larger than allgather_bucket_size through a staging buffer of world x piece elements.
void StepModel::RefreshUpdated(const Unit& u) {
  if (in_.stage() != 1 && in_.stage() != 2) return;
  InGroup(CollectiveOp::kAllGather, GatheredBytes(u));
  const int64_t ranks = in_.shard_ranks(), bucket = in_.manager.allgather_bucket_size;
  if (ranks == 1 || !in_.manager.allgather_partitions || u.layout.padded_numel() <= bucket) {
    return;
  }
  Transient(Cat::kCommBuffers, {std::max<int64_t>(1, bucket / ranks) * ranks * csize()}, compute_);
}

void StepModel::Open(int u, bool backward) {
  Ensure(u);
  if (backward && in_.stage() >= 2 && !units_[u].full_grad.live) {
    units_[u].full_grad =
        r_.Alloc(Cat::kGradients, units_[u].layout.padded_numel() * kRsize, compute_);
  }
}

void StepModel::Close(int u, bool backward) {
  if (backward && in_.stage() >= 2 && !reduce_at_step()) ReducerAdd(u);
  Unit& unit = units_[u];
  if (unit.persistent || planner_.EndUse(u, Resident())) return;
  r_.Free(unit.gathered_buffer);
  unit.gathered = false;
}

void StepModel::ReducerAdd(int u) {
  if (pending_.Add(u, units_[u].layout.padded_numel())) Flush();
}

std::vector<ReduceSizes> StepModel::Sizes(const std::vector<int>& units) const {
  std::vector<ReduceSizes> sizes;
  for (int u : units)
    sizes.push_back({units_[u].layout.padded_numel(), units_[u].layout.shard_numel()});
  return sizes;
}

// As QuantizedReduceScatter::Run ([Note: qgZ]): the data ranks as N nodes of L, ranks placed node
// by node (as DeviceMesh forms them); the chunks' copy, the node-partial sums, and each level's
// three buffers.
void StepModel::QuantizedReduceScatter(int64_t s) {
  const int ranks = in_.shard_ranks();
  const int local = std::clamp(in_.ranks_per_node / in_.tp, 1, ranks);
  const int nodes = ranks % local == 0 ? ranks / local : 1;
  const QgzPlan plan = PlanQgz(s, nodes, ranks / nodes);
  Replay::Handle packed = r_.Alloc(Cat::kCommBuffers, plan.packed * kRsize, comm_);
  Replay::Handle partial = r_.Alloc(Cat::kCommBuffers, plan.partial * kRsize, comm_);
  auto level = [&](const QgzPlan::Level& l, bool crosses) {
    if (l.peers <= 1) return;
    Transient(Cat::kCommBuffers, {l.bytes, l.bytes, l.numel * kRsize}, comm_);
    (crosses ? out_.comm.inter : out_.comm.intra) += (l.peers - 1) * l.bytes;
  };
  level(plan.intra, nodes == 1 && in_.ShardGroupCrossesNodes());
  level(plan.inter, true);
  r_.Free(partial);
  r_.Free(packed);
}

// One reduction of the reduce plan, on the comm stream, as GradientReducer::Flush and AllReduce;
// the `dropped` units' full gradients (stages 2-3; none at stages 0-1, which keep theirs) are
// given back once the comm stream is done with them.
void StepModel::Reduce(const ReducePlan& plan, const std::vector<int>& dropped) {
  Replay::Handle packed, reduced;  // one rank: added straight into the shards, no buffers
  if (plan.packed > 0) packed = r_.Alloc(Cat::kCommBuffers, plan.packed * kRsize, comm_);
  if (plan.reduced > 0) reduced = r_.Alloc(Cat::kCommBuffers, plan.reduced * kRsize, comm_);
  if (plan.path == ReducePlan::Path::kQuantized) {
    QuantizedReduceScatter(plan.shards);
  } else {
    // A collective's bytes are its input's (collective_trace.h): a reduce-scatter's S x count.
    const int64_t in = plan.group_op == CollectiveOp::kReduceScatter ? in_.shard_ranks() : 1;
    InGroup(plan.group_op, plan.group_count * in * kRsize);
  }
  if (plan.replica_shards > 0) Transient(Cat::kCommBuffers, {plan.replica_shards * kRsize}, comm_);
  AcrossReplicas(plan.replica_count * kRsize);
  for (int u : dropped) {  // UnitGradient::Drop: reused once the comm stream is done with it
    r_.Use(units_[u].full_grad, *comm_);
    r_.Free(units_[u].full_grad);
  }
  r_.Free(reduced);
  r_.Free(packed);
}

void StepModel::Flush() {
  const std::vector<int> units = pending_.Take();
  const bool quantized = in_.manager.quantized_gradients && in_.shard_ranks() > 1;
  Reduce(PlanReduceScatter(Sizes(units), Groups(), in_.manager.reduce_scatter, quantized), units);
}

// The attention kernel's own scratch ([Note: what the kernels allocate]), freed per call.
void StepModel::AttentionScratch(bool backward) {
  const DecoderConfig& c = in_.model;
  std::vector<Replay::Handle> h;
  const int heads = c.n_head / in_.tp;
  const AttentionProgram program =
      AttentionProgramFor(backend(), csize(), in_.micro_batch, heads, c.head_size(), in_.attention);
  for (int64_t bytes : AttentionScratchBytes(backend(), program, backward, in_.micro_batch,
                                             c.seq_len, c.attention_channels() / in_.tp, heads,
                                             c.kv_heads() / in_.tp, csize())) {
    h.push_back(r_.Alloc(Cat::kWorkspace, bytes, compute_));
  }
  for (auto& x : h) r_.Free(x);
}

void StepModel::MicroBatch() {
  // Replays DecoderModel's allocations in its order (layers/decoder_model.cc) from the model's own
  // tables, with tensor and sequence parallelism's local sizes from the same geometry: [Note: a
  // micro-batch's buffers] (layers/decoder_plans.h), [Note: a block's activation set] and [Note:
  // the backward's scratch] (layers/decoder_plans.h), [Note: what the kernels allocate]
  // (kernels/memory_facts.h). What is typed here is the order of the calls and of the units'
  // scopes; which units are gathered when is the shard manager's planner's.
  const DecoderConfig& c = in_.model;
  const int blocks = static_cast<int>(st_.blocks.size());
  const int64_t act = csize(), stat = 4, grad = 4;
  const decoder::Geometry g = decoder::MakeGeometry(c, in_.tp, 0, in_.sequence_parallel,
                                                    in_.vocab_multiple, in_.micro_batch, c.seq_len);
  const int64_t rows = g.rows;
  const int64_t head_chunk = HeadChunkRows(in_.head_chunk_rows, rows, c.d_model);
  std::vector<Replay::Handle> acts, ws;
  auto alloc = [&](std::vector<Replay::Handle>& into, Cat cat, int64_t bytes) {
    into.push_back(r_.Alloc(cat, bytes, compute_));
  };
  auto sum = [](const auto& plan) {
    int64_t bytes = 0;
    for (const auto& b : plan) bytes += b.bytes;
    return bytes;
  };
  r_.SetPhase(Replay::kForward);
  const bool per_block = !in_.activation_checkpointing;
  const auto set_plan = decoder::BlockActPlan(
      g, act, stat,
      AttentionSavedBytes(AttentionProgramFor(backend(), act, g.batch, g.h_l, g.hs, in_.attention),
                          g.batch, g.seq, g.h_l, act));
  auto block_set = [&](std::vector<Replay::Handle>& into) {
    for (const decoder::BlockActBuffer& b : set_plan) alloc(into, Cat::kActivations, b.bytes);
  };
  // A pipeline stage holds the activations of the micro-batches its schedule keeps in flight:
  // each one's Begin (tokens, targets, block boundaries; with checkpointing its one set), and the
  // sets of the chunks it is between the forward and the backward of. Begin's forward scratch
  // (sequence parallelism) is counted once.
  const auto begin = decoder::BeginPlan(g, st_.part, c.n_layer, act, /*targets=*/true, per_block);
  int64_t boundary_bytes = 0, boundaries = 0;
  for (int inflight = 0; inflight < st_.live; ++inflight) {
    for (const decoder::MbPlanned& p : begin) {
      if (p.buffer == decoder::MbBuffer::kBlockActs) {
        block_set(acts);
      } else if (p.category == Cat::kActivations) {
        alloc(acts, p.category, p.bytes);
        if (p.buffer == decoder::MbBuffer::kBoundary && inflight == 0) {
          boundary_bytes += p.bytes;
          ++boundaries;
        }
      }
    }
  }
  // The other micro-batches' sets held at the peak.
  const int live_sets = per_block ? std::max(st_.live_sets, blocks) : st_.live;
  for (int k = blocks; per_block && k < live_sets; ++k) block_set(acts);
  std::vector<Replay::Handle> seq;  // Begin's forward scratch, until the backward's replaces it
  for (const decoder::MbPlanned& p : begin) {
    if (p.category == Cat::kWorkspace) alloc(seq, p.category, p.bytes);
  }
  const auto head_plan =
      decoder::HeadPlan(g, act, stat, /*targets=*/true, /*train=*/true, head_chunk);
  int64_t logits_bytes = 0;
  for (const decoder::MbPlanned& p : head_plan) {
    if (p.buffer == decoder::MbBuffer::kLogits) logits_bytes = p.bytes;
  }
  if (!activation_terms_) {
    activation_terms_ = true;
    Term(Tier::kDevice, Cat::kActivations,
         StrCat("one block's activation set, held x ", live_sets,
                per_block ? " (one per block)" : " (checkpointing: one, reused)",
                in_.pp > 1 ? StrCat(" x ", st_.live, " micro-batches in flight") : ""),
         StrCat(g.f.qkv == QkvKind::kRotary
                    ? (g.sp ? "rows x (2 d + (2 d + 2 kv + 3 f)/tp) x act + rows/tp x d x act + "
                              "2 rows/tp x 4 B"
                            : "rows (B x T) x (3 d + (2 d + 2 kv + 3 f)/tp) x act + 2 rows x 4 B")
                : g.sp ? "rows x (2 d + 12 d/tp) x act + rows/tp x d x act + 4 rows/tp x 4 B"
                       : "rows (B x T) x (3 d + 12 d/tp) x act + 4 rows x 4 B",
                in_.cuda ? " + B x heads/tp x T x T x act (probabilities)"
                         : " + B x heads/tp x T x 4 B (flash attention's log-sum-exp)"),
         sum(set_plan));
    Term(Tier::kDevice, Cat::kActivations, StrCat(boundaries, " block inputs/outputs"),
         g.sp ? "(blocks + 1) x rows/tp x d x act" : "(blocks + 1) x rows x d x act",
         boundary_bytes);
    Term(Tier::kDevice, Cat::kWorkspace,
         StrCat("the head's logits, ", head_chunk, " of ", rows, " rows at a time"),
         "head_chunk_rows x padded vocab/tp x act", logits_bytes);
    Term(Tier::kDevice, Cat::kWorkspace, "backward scratch",
         StrCat(g.f.qkv == QkvKind::kRotary
                    ? "rows x (2 d + (max(f, d + 2 kv) + max(2 f, d + 2 kv))/tp) x act"
                    : "rows x (2 d + 8 d/tp) x act",
                g.sp ? " + 2 rows/tp x d x act + 4 d x 4 B" : ""),
         sum(decoder::BackwardScratchPlan(g, act, grad, false)) +
             sum(decoder::BlockBackwardScratchPlan(g, act)));
  }
  const int emb = st_.embedding, norm = st_.norm;
  if (st_.first) {
    Open(emb, false);
    Close(emb, false);
  }
  std::vector<std::vector<Replay::Handle>> sets_of(static_cast<size_t>(blocks));
  // A LLaMA block's Q, K, V before the rotation ([Note: a LLaMA block's projections]): freed
  // before the attention runs.
  const int64_t projections = decoder::QkvFusedInLayout(g, in_.manager.alignment)
                                  ? 0
                                  : decoder::ProjectionScratchBytes(g, act);
  auto project = [&] {
    if (projections == 0) return;
    Transient(Cat::kWorkspace, {projections}, compute_);
  };
  for (int l = 0; l < blocks; ++l) {
    if (per_block) block_set(sets_of[l]);  // allocated by the block's forward
    Open(st_.blocks[l], false);
    project();
    AttentionScratch(false);
    Close(st_.blocks[l], false);
  }
  if (st_.last) {
    for (const decoder::MbPlanned& p : decoder::HeadNormPlan(g, act, stat))
      alloc(acts, p.category, p.bytes);
    if (norm >= 0) {  // cold mode's smallest decoders have none
      Open(norm, false);
      Close(norm, false);
    }
    // The other micro-batches between their head's forward and backward (GPipe: every one):
    // their final LayerNorm, losses and dbtc (a logits chunk exists only inside HeadForward).
    for (int k = 1; k < st_.head_live; ++k) {
      for (const decoder::MbPlanned& p : decoder::HeadNormPlan(g, act, stat)) {
        alloc(acts, p.category, p.bytes);
      }
      for (const decoder::MbPlanned& p : head_plan) {
        if (p.buffer != decoder::MbBuffer::kLogits) alloc(acts, p.category, p.bytes);
      }
    }
  }
  // The head's forward opens the tied unit (or an untied head's) for the backward: each chunk of
  // rows goes through the logits, the cross-entropy and both gradients at once
  // (DecoderStages::HeadForward).
  r_.SetPhase(Replay::kBackward);
  const int head = st_.head >= 0 ? st_.head : emb;
  if (st_.last) {
    Open(head, true);
    Replay::Handle logits;
    for (const decoder::MbPlanned& p : head_plan) {
      if (p.buffer == decoder::MbBuffer::kLogits) {
        logits = r_.Alloc(p.category, p.bytes, compute_);
      } else {
        alloc(p.buffer == decoder::MbBuffer::kDbtc ? ws : acts, p.category, p.bytes);
      }
    }
    for (int64_t r0 = 0; r0 < rows && !g.whole_vocab(); r0 += head_chunk) {
      // The vocabulary-parallel cross-entropy's per-row statistics, per chunk.
      std::vector<Replay::Handle> ce;
      for (int64_t bytes :
           VocabParallelCrossEntropyScratch(std::min(head_chunk, rows - r0), stat)) {
        alloc(ce, Cat::kWorkspace, bytes);
      }
      for (auto it = ce.rbegin(); it != ce.rend(); ++it) r_.Free(*it);
    }
    r_.Free(logits);
    if (!st_.first || st_.head >= 0) Close(head, true);
  }
  // The backward's scratch (DecoderStages::EnsureBackwardScratch): the forward's goes first.
  for (auto& h : seq) r_.Free(h);
  for (const decoder::ScratchBuffer& b : decoder::BackwardScratchPlan(g, act, grad, st_.last)) {
    alloc(ws, Cat::kWorkspace, b.bytes);
  }
  if (st_.last && norm >= 0) {  // the final LayerNorm's backward (no scratch of its own)
    Open(norm, true);
    Close(norm, true);
  }
  for (const decoder::ScratchBuffer& b : decoder::BlockBackwardScratchPlan(g, act)) {
    alloc(ws, Cat::kWorkspace, b.bytes);
  }
  // The micro-batch's backward scratch lives from its first backward to its last: the
  // interleaved schedule has several micro-batches between the two.
  const size_t one_scratch = ws.size();
  for (int k = 1; k < st_.backward_live; ++k) {
    for (size_t i = 0; i < one_scratch; ++i) alloc(ws, Cat::kWorkspace, ws[i].bytes);
  }
  for (int l = blocks - 1; l >= 0; --l) {
    const int u = st_.blocks[l];
    Open(u, true);
    if (!per_block) {  // the recomputed forward, with its own forward scratch
      std::vector<Replay::Handle> scratch;
      for (const decoder::MbPlanned& p : decoder::SeqScratchPlan(g, act))
        alloc(scratch, p.category, p.bytes);
      project();
      AttentionScratch(false);
      for (auto it = scratch.rbegin(); it != scratch.rend(); ++it) r_.Free(*it);
    }
    AttentionScratch(true);
    Close(u, true);
    for (auto& h : sets_of[l]) r_.Free(h);  // spent by the block's backward
  }
  if (st_.first) {
    // The input embedding's backward: its own scope unless the tied head kept it open.
    if (!st_.last || st_.head >= 0) Open(emb, true);
    Close(emb, true);
  }
  for (auto& h : acts) r_.Free(h);
  for (auto& h : ws) r_.Free(h);
}

// [Note: 1-bit Adam], after freeze_step (the steady state the model replays): no gradient
// all-reduce; each unit's momentum through OneBitAllReduce::Run in the optimizer step, its
// buffers taken on the compute stream, its ring of SendRecv and its all-gather of the packages.
// 0/1 Adam ([Note: 0/1 Adam]): a synchronising step after var_freeze_step, the same collectives
// over its accumulated steps (the local steps between send nothing).
int64_t StepModel::OneBitLambNumel() const {
  int64_t n = 0;
  for (const Unit& u : units_) {
    for (const ShardPiece& p : u.layout.ShardPieces(0)) n += p.shard_range.size();
  }
  return n;
}

void StepModel::OneBitCompressedStep() {
  const int ranks = in_.shard_ranks();
  if (ranks == 1) return;
  if (in_.manager.optimizer.kind == OptimizerKind::kOneBitLamb) {
    // [Note: 1-bit LAMB]: the rank's whole momentum, padded, as one segment.
    const OneBitAllReduce::Segment whole{0, OneBitAllReduce::Padded(OneBitLambNumel(), ranks)};
    const int64_t msg = OneBitAllReduce::MessageBytes(std::span(&whole, 1), ranks);
    const auto b = OneBitAllReduce::BufferBytes(std::span(&whole, 1), ranks);
    Transient(Cat::kCommBuffers, {b.send, b.recv, b.package, b.sums}, compute_);
    (in_.ShardGroupCrossesNodes() ? out_.comm.inter : out_.comm.intra) += (ranks - 1) * msg;
    InGroup(CollectiveOp::kAllGather, ranks * msg);
    return;
  }
  for (const Unit& u : units_) {
    const std::vector<OneBitAllReduce::Segment> segments = OneBitSegments(u.layout);
    const int64_t msg = OneBitAllReduce::MessageBytes(segments, ranks);
    const auto b = OneBitAllReduce::BufferBytes(segments, ranks);
    Transient(Cat::kCommBuffers, {b.send, b.recv, b.package, b.sums}, compute_);
    (in_.ShardGroupCrossesNodes() ? out_.comm.inter : out_.comm.intra) += (ranks - 1) * msg;
    InGroup(CollectiveOp::kAllGather, ranks * msg);
  }
}

// The units' updates in order, as ShardedOptimizer::StepInMemory allocates for them:
// - [Note: gradient sums on the device]: each host-tier unit's gradient sum copied to the host
//   (ShardedOptimizer::StageGradient) before its update: freed after the update by a synchronous
//   step, held to the unit's completion by a deferred one. On a GPU into pinned memory with the
//   other staging copies of offloaded shards (not modelled: kCaveats, zerort estimate); here, on
//   the CPU device, from the host tier's allocator.
// - LAMB's per-parameter sums (ShardedOptimizer::UpdateLamb: two floats a parameter of the unit,
//   zero-filled), workspace while the unit updates: from the host tier's allocator for a
//   host-tier unit on a GPU, else the device's (on the CPU device the host tier's master is
//   device-readable), on the tier's stream (none for the host tiers). LAMB is never deferred.
void StepModel::UnitUpdates() {
  const bool lamb = in_.manager.optimizer.kind == OptimizerKind::kLamb;
  for (Unit& u : units_) {
    const PlannedBuffer* grad = u.plan.Find(UnitBuffer::kGradShard);
    const PlannedBuffer* master = u.plan.Find(UnitBuffer::kMaster);
    if (master == nullptr) continue;
    const bool on_host = master->tier != Tier::kDevice;
    const bool staged = !in_.cuda && grad != nullptr && grad->tier == Tier::kDevice && on_host;
    if (staged) u.grad_staged = r_.Alloc(Cat::kStaging, grad->bytes(), nullptr, master->tier);
    if (lamb) {
      const int64_t sums = 2 * static_cast<int64_t>(u.layout.params().size()) * 4;
      Replay::Handle h = r_.Alloc(Cat::kWorkspace, sums, on_host ? nullptr : compute_,
                                  on_host && in_.cuda ? master->tier : Tier::kDevice);
      r_.Free(h);
    }
    if (staged && !defers_) r_.Free(u.grad_staged);
  }
}

void StepModel::Step() {
  r_.SetPhase(Replay::kStep);
  SettleThrough(static_cast<int>(units_.size()) - 1);  // as ShardManager::StepImpl
  for (Unit& u : units_) u.secondary_valid = false;    // the step changes the weights
  for (int u : planner_.TakeKept()) {  // as ShardManager::StepImpl: kept units released first
    r_.Free(units_[u].gathered_buffer);
    units_[u].gathered = false;
  }
  if (in_.stage() >= 2) {
    if (reduce_at_step()) {  // as ShardManager::ReduceGradients: every full gradient, last first
      for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
        if (units_[u].full_grad.live) ReducerAdd(u);
      }
    }
    Flush();
  } else if (IsOneBit(in_.manager.optimizer.kind)) {
    OneBitCompressedStep();
  } else {
    // As GradientReducer::Finish: every unit's full gradient, all-reduced in buckets.
    ReduceBucket<int> bucket(in_.manager.reduce_bucket_size);
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      if (bucket.Add(u, units_[u].layout.padded_numel())) {
        Reduce(PlanAllReduce(Sizes(bucket.Take()), Groups()), {});
      }
    }
    Reduce(PlanAllReduce(Sizes(bucket.Take()), Groups()), {});
  }
  Transient(Cat::kWorkspace, {8}, compute_);  // norm/overflow accumulator
  UnitUpdates();
  // The updated units refreshed now, or as the next forward first uses them (a deferred step).
  if (defers_) {
    settled_ = 0;
  } else {
    for (const Unit& u : units_) RefreshUpdated(u);
  }
  Transient(Cat::kCommBuffers, {4}, compute_);  // the trainer's loss mean
  Transient(Cat::kCommBuffers, {4}, compute_);  // and stop flag
  planner_.EndStep();
}

void StepModel::Run() {
  Init();
  // The first step records the order (no prefetch) and fills the allocator's cache; the second,
  // the one measured, replays it with prefetch, as every later step does.
  for (int k = 0; k < in_.accumulation; ++k) MicroBatch();
  Step();
  r_.ResetPeaks();
  out_.comm = {};  // the measured step's collectives only
  for (int k = 0; k < in_.accumulation; ++k) MicroBatch();
  Step();
  out_.peaks = r_.Snapshot();
  const auto& phases = r_.phase_peaks();
  for (int t = 0; t < kNumMemoryTiers; ++t) {
    out_.phase_forward[t] = phases[Replay::kForward][t];
    out_.phase_backward[t] = phases[Replay::kBackward][t];
    out_.phase_step[t] = phases[Replay::kStep][t];
  }
  // Every buffer back to its allocator before the allocators go.
  for (Replay::Handle& h : persistent_) r_.Free(h);
  for (Unit& u : units_) {
    r_.Free(u.gathered_buffer);
    r_.Free(u.full_grad);
    r_.Free(u.grad_staged);
  }
}

}  // namespace zerort::memory_internal
