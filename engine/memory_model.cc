// The memory model: a replay of one steady-state training step's allocations.
#include "engine/memory_model.h"

#include <algorithm>
#include <map>

#include "engine/memory_replay.h"
#include "layers/gpt_block.h"
#include "layers/gpt_model.h"
#include "layers/pipeline_executor.h"
#include "layers/pipeline_schedule.h"
#include "offload/staging_pool.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/strings.h"
#include "sharding/flat_layout.h"
#include "sharding/reuse_distance.h"
#include "sharding/sharded_optimizer.h"
#include "sharding/unit_plan.h"

namespace zerort {
namespace {

using Cat = MemoryCategory;
using Tier = MemoryTier;

constexpr int64_t kLtWorkspace = int64_t{32} << 20;  // kernels/cuda/model_ops.cuh

struct Unit {
  FlatLayout layout;
  UnitPlan plan;
  bool persistent = false;
  bool gathered = false;  // stage 3: a gathered buffer exists (gathering or unsharded)
  bool kept = false;      // stage 3: kept gathered at its use's end (stage3_max_reuse_distance)
  size_t use_position = 0;
  Replay::Handle gathered_buffer, full_grad;
};

// What one pipeline stage holds (the whole model without pipeline parallelism), as unit indexes.
struct StageUnits {
  int embedding = -1;       // the first stage's input embedding, the last stage's tied head
  int norm = -1;            // the final LayerNorm, on the last stage
  std::vector<int> blocks;  // in model order
  int boundaries = 0;       // residual-stream buffers per micro-batch (GptModel::Begin's block_out)
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
        activation_terms_(model_states_only) {
    // The runtime's streams: the manager's compute and comm streams (comm is compute without
    // overlap_comm), and the kernels' own (the CPU kernels have one; CUDA's use compute).
    compute_stream_ = *CreateStream(Device::Cpu(), "compute");
    comm_stream_ = *CreateStream(Device::Cpu(), "comm");
    model_stream_ = *CreateStream(Device::Cpu(), "model");
    compute_ = compute_stream_.get();
    comm_ = in.manager.overlap_comm ? comm_stream_.get() : compute_;
    kernels_ = in.cuda ? compute_ : model_stream_.get();
  }

  void Run();

 private:
  int64_t csize() const { return static_cast<int64_t>(DTypeSize(in_.compute())); }
  static constexpr int64_t kRsize = 4;  // reduce dtype fp32
  bool stage3() const { return in_.stage() == 3; }
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
  void Prefetch();
  void Open(int u, bool backward);
  void Close(int u, bool backward);
  void ReducerAdd(int u);
  void Flush();
  void AttentionScratch(bool backward);
  int64_t LiveGathered() const;  // bytes of non-persistent units gathered or gathering

  // A unit's all-gather: its buffer on the comm stream, then read on the compute stream.
  Replay::Handle Gather(const Unit& u) {
    Replay::Handle h = r_.Alloc(Cat::kGatheredWeights, GatheredBytes(u), comm_);
    r_.Use(h, *compute_);
    return h;
  }

  const MemoryModelInput& in_;
  const ShardManagerOptions options_;
  std::unique_ptr<Stream> compute_stream_, comm_stream_, model_stream_;
  Stream* compute_ = nullptr;
  Stream* comm_ = nullptr;
  Stream* kernels_ = nullptr;
  bool recording_ = true;  // the first step records the unit order; no prefetch yet
  std::vector<Unit> units_;
  const StageUnits st_;
  MemoryEstimate& out_;
  Replay r_;
  std::vector<int> order_;                // recorded unit order of one step
  std::vector<int64_t> reuse_distances_;  // per position of order_ (sharding/reuse_distance.h)
  size_t position_ = 0;
  std::vector<int> pending_;
  int64_t pending_numel_ = 0;
  std::vector<Replay::Handle> persistent_;
  bool activation_terms_;  // written (or, in cold mode, never to be written)
};

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
    const int64_t bytes = StagingPool::AllocationBytes(
        in_.manager.offload.param_buffer_count,
        static_cast<size_t>(in_.manager.offload.param_buffer_size * csize()));
    persistent_.push_back(r_.Alloc(Cat::kStaging, bytes, nullptr, host_tier));
    Term(host_tier, Cat::kStaging, "parameter fetch buffers (offload_param nvme)",
         "buffer_count x buffer_size x compute bytes", bytes);
  }
  std::map<std::pair<Tier, Cat>, std::pair<std::string, int64_t>> sums;
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
      auto& sum = sums[{b.tier, b.category}];
      sum.first += (sum.first.empty() ? "" : ", ") + std::string(UnitBufferName(b.buffer));
      sum.second += b.bytes();
      // The master's and the compute shard's initial values go to NVMe through a host buffer.
      if (b.tier == Tier::kNvme &&
          (b.buffer == UnitBuffer::kMaster || b.buffer == UnitBuffer::kComputeShard)) {
        transient(AlignedAllocationBytes(b.bytes()));
      }
    }
  }
  for (const auto& [key, what] : sums) {
    // One line per tier and category: which buffers, summed over units.
    std::string names = what.first;
    if (names.size() > 60) names = names.substr(0, 57) + "...";
    Term(key.first, key.second, names,
         "sum over units of the planned buffers (sharding/unit_plan.h)", what.second);
  }
  if (gathered > 0) {
    Term(Tier::kDevice, Cat::kGatheredWeights, "persistent units, always gathered",
         "units below stage3_param_persistence_threshold: padded_numel x compute bytes", gathered);
  }
  if (at.optimizer == Tier::kNvme) {
    const int64_t chunk = ShardedOptimizer::NvmeChunkNumel(options_, largest_shard);
    const int64_t bytes = StagingPool::AllocationBytes(
        std::max(in_.manager.offload.optimizer_buffer_count, 2),
        static_cast<size_t>(ShardedOptimizer::StagingSetBytes(options_, chunk)));
    persistent_.push_back(r_.Alloc(Cat::kStaging, bytes, nullptr, host_tier));
    Term(host_tier, Cat::kStaging, "optimizer chunk staging sets (offload_optimizer nvme)",
         "buffer_count x (4 x chunk x 4 B + chunk x compute bytes), chunk <= sub_group_size",
         bytes);
  }
  if (in_.cuda) {
    persistent_.push_back(r_.Alloc(Cat::kWorkspace, kLtWorkspace, kernels_));
    Term(Tier::kDevice, Cat::kWorkspace, "cuBLASLt workspace", "32 MiB", kLtWorkspace);
  }
}

void StepModel::Ensure(int u) {
  Unit& unit = units_[u];
  unit.use_position = position_;
  unit.kept = false;
  if (stage3() && !unit.persistent && !unit.gathered) {
    unit.gathered_buffer = Gather(unit);
    unit.gathered = true;
  }
  if (stage3() && !recording_) Prefetch();
  ++position_;
}

// As ShardManager::Prefetch: the next units of the recorded order, within both budgets.
void StepModel::Prefetch() {
  const int64_t live_budget = in_.manager.stage3_max_live_parameters * csize();
  const int64_t ahead_budget = in_.manager.stage3_prefetch_bucket_size * csize();
  int64_t ahead = 0;
  for (size_t i = position_ + 1; i < order_.size(); ++i) {
    Unit& u = units_[order_[i]];
    if (u.persistent || u.gathered) continue;
    const int64_t live = LiveGathered();
    if (ahead + GatheredBytes(u) > ahead_budget || live + GatheredBytes(u) > live_budget) break;
    u.gathered_buffer = Gather(u);
    u.gathered = true;
    ahead += GatheredBytes(u);
  }
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
  if (stage3() && !unit.persistent) {
    int64_t next = 0;  // the unit used next, gathered then on demand
    if (position_ < order_.size()) {
      const Unit& n = units_[order_[position_]];
      if (!n.persistent && !n.gathered) next = GatheredBytes(n);
    }
    if (!recording_ &&
        KeepsGathered(reuse_distances_, unit.use_position, in_.manager.stage3_max_reuse_distance) &&
        LiveGathered() + next <= in_.manager.stage3_max_live_parameters * csize()) {
      unit.kept = true;  // as ShardManager::KeepGathered
      return;
    }
    r_.Free(unit.gathered_buffer);
    unit.gathered = false;
  }
}

int64_t StepModel::LiveGathered() const {
  int64_t live = 0;
  for (const Unit& v : units_) {
    if (!v.persistent && v.gathered) live += GatheredBytes(v);
  }
  return live;
}

void StepModel::ReducerAdd(int u) {
  if (std::find(pending_.begin(), pending_.end(), u) != pending_.end()) return;
  pending_.push_back(u);
  pending_numel_ += units_[u].layout.padded_numel();
  if (pending_numel_ >= in_.manager.reduce_bucket_size) Flush();
}

// As GradientReducer::FlushReduceScatter.
void StepModel::Flush() {
  if (pending_.empty()) return;
  int64_t bucket_shard = 0;
  for (int u : pending_) bucket_shard += units_[u].layout.shard_numel();
  Replay::Handle packed, reduced;  // one rank: added straight into the shards, no buffers
  if (pending_.size() > 1 && in_.dp > 1) {
    packed = r_.Alloc(Cat::kCommBuffers, bucket_shard * in_.dp * kRsize, comm_);
  }
  if (in_.dp > 1) reduced = r_.Alloc(Cat::kCommBuffers, bucket_shard * kRsize, comm_);
  for (int u : pending_) {  // DropFullGrad: reused once the comm stream is done with it
    r_.Use(units_[u].full_grad, *comm_);
    r_.Free(units_[u].full_grad);
  }
  r_.Free(reduced);
  r_.Free(packed);
  pending_.clear();
  pending_numel_ = 0;
}

// The CUDA attention's scratch (kernels/cuda/model_kernels.cu), allocated and freed per call.
void StepModel::AttentionScratch(bool backward) {
  if (!in_.cuda) return;
  const GptConfig& c = in_.model;
  const int64_t n = int64_t{in_.micro_batch} * c.seq_len * (c.d_model / in_.tp) * csize();
  const int64_t tt =
      int64_t{in_.micro_batch} * (c.n_head / in_.tp) * c.seq_len * c.seq_len * csize();
  std::vector<Replay::Handle> h;
  for (int i = 0; i < (backward ? 4 : 3); ++i) h.push_back(r_.Alloc(Cat::kWorkspace, n, kernels_));
  h.push_back(r_.Alloc(Cat::kWorkspace, tt, kernels_));
  if (backward) h.push_back(r_.Alloc(Cat::kWorkspace, n, kernels_));
  for (auto& x : h) r_.Free(x);
}

void StepModel::MicroBatch() {
  // Replays GptModel::Run's allocations in its order (layers/gpt_model.cc), with tensor and
  // sequence parallelism's local sizes from the same geometry: columns split by tp, the
  // residual stream's rows by tp under sequence parallelism, the padded vocabulary's rows by tp.
  const GptConfig& c = in_.model;
  const int blocks = static_cast<int>(st_.blocks.size());
  const int64_t tp = in_.tp;
  const int64_t rows = int64_t{in_.micro_batch} * c.seq_len;
  const bool sp = in_.sequence_parallel && tp > 1 && rows % tp == 0;
  const int64_t rows_l = sp ? rows / tp : rows;  // this rank's rows of the residual stream
  const int64_t d = c.d_model, dl = d / tp;      // full and tensor-parallel-local channels
  const int64_t act = csize(), stat = 4, grad = 4;
  const int64_t heads = c.n_head / tp;
  const int64_t vocab_l = PaddedVocab(c, in_.tp, in_.vocab_multiple) / tp;
  const bool whole_vocab = tp == 1 && vocab_l == c.vocab_size;
  const int64_t head_chunk = HeadChunkRows(in_.head_chunk_rows, rows, c.d_model);
  std::vector<Replay::Handle> acts;
  auto a = [&](int64_t bytes) { acts.push_back(r_.Alloc(Cat::kActivations, bytes, kernels_)); };
  r_.SetPhase(Replay::kForward);
  const bool per_block = !in_.activation_checkpointing;
  // What the attention keeps for its backward (ModelKernels::AttentionSavedBytes): the CUDA
  // kernels the probabilities, the CPU kernels (flash-style) a log-sum-exp per query.
  const int64_t attention_saved =
      in_.cuda ? int64_t{in_.micro_batch} * heads * c.seq_len * c.seq_len * act
               : int64_t{in_.micro_batch} * heads * c.seq_len * 4;
  // One block's activation set: the model's own table (layers/gpt_block.h, BlockActPlan).
  const gpt::Geometry geometry = gpt::MakeGeometry(c, in_.tp, 0, in_.sequence_parallel,
                                                   in_.vocab_multiple, in_.micro_batch, c.seq_len);
  const auto plan = gpt::BlockActPlan(geometry, act, stat, attention_saved);
  int64_t set_bytes = 0;
  for (const gpt::BlockActBuffer& b : plan) set_bytes += b.bytes;
  auto block_set = [&](std::vector<Replay::Handle>& into) {
    for (const gpt::BlockActBuffer& b : plan) {
      into.push_back(r_.Alloc(Cat::kActivations, b.bytes, kernels_));
    }
  };
  // A pipeline stage holds the activations of the micro-batches its schedule keeps in flight:
  // each one's tokens and block boundaries, and the sets of the chunks it is between the forward
  // and the backward of (with checkpointing: one set per micro-batch).
  for (int inflight = 0; inflight < st_.live; ++inflight) {
    a(rows * 4);  // tokens
    a(rows * 4);  // targets
    if (!per_block) block_set(acts);
    for (int l = 0; l < st_.boundaries; ++l) a(rows_l * d * act);  // block inputs/outputs
  }
  // The other micro-batches' sets held at the peak.
  const int live_sets = per_block ? std::max(st_.live_sets, blocks) : st_.live;
  for (int k = blocks; per_block && k < live_sets; ++k) block_set(acts);

  Replay::Handle seq_local, seq_full;  // sequence parallelism's forward scratch
  if (sp) {
    seq_local = r_.Alloc(Cat::kWorkspace, rows_l * d * act, kernels_);
    seq_full = r_.Alloc(Cat::kWorkspace, rows * d * act, kernels_);
  }
  if (!activation_terms_) {
    activation_terms_ = true;
    Term(Tier::kDevice, Cat::kActivations,
         StrCat("one block's activation set, held x ", live_sets,
                per_block ? " (one per block)" : " (checkpointing: one, reused)",
                in_.pp > 1 ? StrCat(" x ", st_.live, " micro-batches in flight") : ""),
         StrCat(sp ? "rows x (2 d + 12 d/tp) x act + rows/tp x d x act + 4 rows/tp x 4 B"
                   : "rows (B x T) x (3 d + 12 d/tp) x act + 4 rows x 4 B",
                in_.cuda ? " + B x heads/tp x T x T x act (probabilities)"
                         : " + B x heads/tp x T x 4 B (flash attention's log-sum-exp)"),
         set_bytes);
    Term(Tier::kDevice, Cat::kActivations, StrCat(st_.boundaries, " block inputs/outputs"),
         sp ? "(blocks + 1) x rows/tp x d x act" : "(blocks + 1) x rows x d x act",
         st_.boundaries * rows_l * d * act);
    Term(Tier::kDevice, Cat::kWorkspace,
         StrCat("the head's logits, ", head_chunk, " of ", rows, " rows at a time"),
         "head_chunk_rows x padded vocab/tp x act", head_chunk * vocab_l * act);
    Term(Tier::kDevice, Cat::kWorkspace, "backward scratch",
         sp ? "rows x (2 d + 8 d/tp) x act + 2 rows/tp x d x act + 4 d x 4 B"
            : "rows x (2 d + 8 d/tp) x act",
         sp ? rows * d * act + rows_l * d * act + rows * 8 * dl * act + rows * d * act +
                  rows_l * d * act + 4 * d * grad
            : rows * (2 * d + 8 * dl) * act);
  }
  const int emb = st_.embedding, norm = st_.norm;
  if (st_.first) {
    Open(emb, false);
    Close(emb, false);
  }
  std::vector<std::vector<Replay::Handle>> sets_of(static_cast<size_t>(blocks));
  for (int l = 0; l < blocks; ++l) {
    if (per_block) block_set(sets_of[l]);  // allocated by the block's forward
    Open(st_.blocks[l], false);
    AttentionScratch(false);
    Close(st_.blocks[l], false);
  }
  if (st_.last) {
    a(rows * d * act);  // final LayerNorm (every row)
    a(rows_l * stat);
    a(rows_l * stat);
    if (norm >= 0) {  // cold mode's smallest decoders have none
      Open(norm, false);
      Close(norm, false);
    }
    // The other micro-batches between their head's forward and backward (GPipe: every one):
    // the final LayerNorm, the losses and the head's gradient of the LayerNorm output.
    for (int k = 1; k < st_.head_live; ++k) {
      a(rows * d * act);
      a(rows_l * stat);
      a(rows_l * stat);
      a(rows * stat);  // losses
      acts.push_back(r_.Alloc(Cat::kWorkspace, rows * d * act, kernels_));
    }
  }
  // The head's forward opens the tied unit for the backward: each chunk of rows goes through
  // the logits, the cross-entropy and both gradients at once (GptModel::HeadForward).
  r_.SetPhase(Replay::kBackward);
  std::vector<Replay::Handle> ws;
  if (st_.last) {
    Open(emb, true);
    a(rows * stat);                                                     // losses
    ws.push_back(r_.Alloc(Cat::kWorkspace, rows * d * act, kernels_));  // the head's dbtc
    Replay::Handle logits = r_.Alloc(Cat::kWorkspace, head_chunk * vocab_l * act, kernels_);
    for (int64_t r0 = 0; r0 < rows && !whole_vocab; r0 += head_chunk) {
      // The vocabulary-parallel cross-entropy's per-row statistics, per chunk.
      const int64_t n = std::min(head_chunk, rows - r0);
      Replay::Handle max = r_.Alloc(Cat::kWorkspace, n * stat, kernels_);
      Replay::Handle sums = r_.Alloc(Cat::kWorkspace, 2 * n * stat, kernels_);
      r_.Free(sums);
      r_.Free(max);
    }
    r_.Free(logits);
    if (!st_.first) Close(emb, true);
  }
  // The backward's scratch (GptModel::EnsureBackwardScratch): the forward's goes first.
  if (sp) {
    r_.Free(seq_local);
    r_.Free(seq_full);
  }
  for (const gpt::ScratchBuffer& b : gpt::BackwardScratchPlan(geometry, act, grad, st_.last)) {
    ws.push_back(r_.Alloc(Cat::kWorkspace, b.bytes, kernels_));
  }
  auto ln_scratch = [&] {
    if (!in_.cuda) return;
    Replay::Handle h = r_.Alloc(Cat::kWorkspace, 2 * d * 4, kernels_);
    r_.Free(h);
  };
  if (st_.last && norm >= 0) {
    Open(norm, true);
    ln_scratch();
    Close(norm, true);
  }
  ws.push_back(r_.Alloc(Cat::kWorkspace, rows * 4 * dl * act, kernels_));
  ws.push_back(r_.Alloc(Cat::kWorkspace, rows * 4 * dl * act, kernels_));
  // The micro-batch's backward scratch lives from its first backward to its last: the
  // interleaved schedule has several micro-batches between the two.
  const size_t one_scratch = ws.size();
  for (int k = 1; k < st_.backward_live; ++k) {
    for (size_t i = 0; i < one_scratch; ++i) {
      ws.push_back(r_.Alloc(Cat::kWorkspace, ws[i].bytes, kernels_));
    }
  }
  for (int l = blocks - 1; l >= 0; --l) {
    const int u = st_.blocks[l];
    Open(u, true);
    if (!per_block) {  // the recomputed forward
      Replay::Handle local, full;
      if (sp) {
        local = r_.Alloc(Cat::kWorkspace, rows_l * d * act, kernels_);
        full = r_.Alloc(Cat::kWorkspace, rows * d * act, kernels_);
      }
      AttentionScratch(false);
      if (sp) {
        r_.Free(full);
        r_.Free(local);
      }
    }
    ln_scratch();
    AttentionScratch(true);
    ln_scratch();
    Close(u, true);
    for (auto& h : sets_of[l]) r_.Free(h);  // spent by the block's backward
  }
  if (st_.first) {
    if (!st_.last) Open(emb, true);  // the input embedding's backward
    Close(emb, true);
  }
  for (auto& h : acts) r_.Free(h);
  for (auto& h : ws) r_.Free(h);
}

void StepModel::Step() {
  r_.SetPhase(Replay::kStep);
  for (Unit& u : units_) {  // as ShardManager::StepImpl: kept units are released first
    if (!u.kept) continue;
    r_.Free(u.gathered_buffer);
    u.gathered = false;
    u.kept = false;
  }
  if (in_.stage() >= 2) {
    if (reduce_at_step()) {  // as ShardManager::ReduceGradients: every full gradient, last first
      for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
        if (units_[u].full_grad.live) ReducerAdd(u);
      }
    }
    Flush();
  } else {
    // As GradientReducer::Finish: all-reduce buckets of whole units; one unit needs no packing,
    // one rank no all-reduce.
    std::vector<int> bucket;
    int64_t numel = 0;
    auto reduce = [&] {
      if (bucket.size() > 1 && in_.dp > 1) {
        Replay::Handle h = r_.Alloc(Cat::kCommBuffers, numel * kRsize, comm_);
        r_.Free(h);
      }
      bucket.clear();
      numel = 0;
    };
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      bucket.push_back(u);
      numel += units_[u].layout.padded_numel();
      if (numel >= in_.manager.reduce_bucket_size) reduce();
    }
    reduce();
  }
  Replay::Handle acc = r_.Alloc(Cat::kWorkspace, 8, compute_);  // norm/overflow accumulator
  r_.Free(acc);
  // As ShardedUnit::GatherUpdated: stages 1-2 all-gather a unit larger than
  // allgather_bucket_size through a staging buffer of world x piece elements.
  if ((in_.stage() == 1 || in_.stage() == 2) && in_.dp > 1 && in_.manager.allgather_partitions) {
    for (const Unit& u : units_) {
      const int64_t shard = u.layout.shard_numel();
      if (shard * in_.dp <= in_.manager.allgather_bucket_size) continue;
      const int64_t piece = std::max<int64_t>(1, in_.manager.allgather_bucket_size / in_.dp);
      Replay::Handle h = r_.Alloc(Cat::kCommBuffers, piece * in_.dp * csize(), compute_);
      r_.Free(h);
    }
  }
  for (int i = 0; i < 2; ++i) {  // the trainer's loss mean and stop flag
    Replay::Handle h = r_.Alloc(Cat::kCommBuffers, 4, compute_);
    r_.Free(h);
  }
}

void StepModel::Run() {
  for (int k = 0; k < in_.accumulation; ++k) {  // the order the first step records
    if (st_.first) order_.push_back(st_.embedding);
    for (int u : st_.blocks) order_.push_back(u);
    if (st_.last) {
      if (st_.norm >= 0) order_.push_back(st_.norm);
      order_.push_back(st_.embedding);  // the head (the first stage's stays open)
      if (st_.norm >= 0) order_.push_back(st_.norm);
    }
    for (auto it = st_.blocks.rbegin(); it != st_.blocks.rend(); ++it) order_.push_back(*it);
    if (st_.first && !st_.last) order_.push_back(st_.embedding);
  }
  std::vector<int64_t> numel;
  for (const Unit& u : units_) numel.push_back(u.plan.persistent ? 0 : u.layout.padded_numel());
  reuse_distances_ = ReuseDistances(order_, numel);
  Init();
  // The first step records the order (no prefetch) and fills the allocator's cache; the second,
  // the one measured, replays it with prefetch, as every later step does.
  for (int k = 0; k < in_.accumulation; ++k) MicroBatch();
  Step();
  recording_ = false;
  r_.ResetPeaks();
  position_ = 0;
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
  }
}

// A unit of `params` laid out and planned as the runtime does (FlatLayout over the stage's shard
// count, UnitPlan), appended to `units` and counted in `out.parameters`; its index.
StatusOr<int> AddUnit(const MemoryModelInput& in, const ShardManagerOptions& options,
                      const std::vector<ParamSpec>& params, std::vector<Unit>& units,
                      MemoryEstimate& out) {
  for (const ParamSpec& p : params) out.parameters += p.numel();
  ZR_ASSIGN_OR_RETURN(FlatLayout layout,
                      FlatLayout::Create(params, ShardCount(in.manager.stage, in.dp)));
  UnitPlan plan = PlanUnit(options, layout);
  units.push_back(Unit{std::move(layout), std::move(plan)});
  return static_cast<int>(units.size()) - 1;
}

}  // namespace

StatusOr<MemoryEstimate> EstimateMemory(const MemoryModelInput& in) {
  ZR_RETURN_IF_ERROR(in.Validate());
  // The units of this rank: the runtime's own parameter list, split as tensor parallelism
  // splits it, and the stage's share of it as the runtime splits it (GptModel::Create).
  // Rank 0's parameters: every tensor-parallel rank's parts have the same shapes.
  ZR_ASSIGN_OR_RETURN(std::vector<GptUnit> all, GptUnits(in.model, in.tp, 0, in.vocab_multiple));
  const int L = in.model.n_layer;
  GptStagePart part;
  part.first = in.pipeline_stage == 0;
  part.last = in.pipeline_stage == in.pp - 1;
  if (in.pp > 1) {
    ZR_ASSIGN_OR_RETURN(part.chunks, StageChunks(L, in.pp, in.virtual_stages, in.pipeline_layers,
                                                 in.pipeline_stage));
  }
  StageUnits stage{.first = part.first, .last = part.last};
  std::vector<Unit> units;
  MemoryEstimate out;
  const ShardManagerOptions& options = in.manager;
  auto add = [&](const GptUnit& unit) -> StatusOr<int> {
    return AddUnit(in, options, unit.params, units, out);
  };
  if (part.first || part.last) {
    ZR_ASSIGN_OR_RETURN(stage.embedding, add(all[0]));
  }
  for (int l = 0; l < L; ++l) {
    if (!part.holds(l)) continue;
    ZR_ASSIGN_OR_RETURN(const int u, add(all[1 + l]));
    stage.blocks.push_back(u);
  }
  if (part.last) {
    ZR_ASSIGN_OR_RETURN(stage.norm, add(all[L + 1]));
  }
  for (int l = 0; l <= L; ++l) {  // as GptModel::Begin
    const bool used = part.holds(l) || (l > 0 && part.holds(l - 1)) || (l == 0 && part.first) ||
                      (l == L && part.last);
    stage.boundaries += used ? 1 : 0;
  }
  if (in.pp > 1) {
    ZR_ASSIGN_OR_RETURN(const PipelineSchedule schedule,
                        ParsePipelineSchedule(in.pipeline_schedule));
    ZR_ASSIGN_OR_RETURN(
        const std::vector<PipelineAction> actions,
        PipelineActions({schedule, in.pp, in.accumulation, in.virtual_stages}, in.pipeline_stage));
    const StageLiveness live = PipelineStageLiveness(actions, part.chunks, in.virtual_stages);
    stage.live = live.micro_batches;
    stage.live_sets = live.block_sets;
    stage.backward_live = live.backward;
    stage.head_live = part.last ? live.head : 0;
  }
  StepModel model(in, std::move(units), std::move(stage), out);
  model.Run();
  return out;
}

StatusOr<MemoryEstimate> EstimateColdModelStates(const MemoryModelInput& layout, int64_t params,
                                                 int64_t largest) {
  ZR_ASSIGN_OR_RETURN(const ColdDecoder decoder, FitColdDecoder(params, largest));
  MemoryModelInput in = layout;
  // No shape: the activation replay runs on a token-sized model and is not recorded.
  in.model = GptConfig{.n_layer = std::max(1, decoder.blocks),
                       .n_head = 1,
                       .d_model = 1,
                       .seq_len = 1,
                       .vocab_size = 1};
  in.micro_batch = 1;
  in.tp = 1;
  in.sequence_parallel = false;
  in.pp = 1;
  in.pipeline_stage = 0;
  in.pipeline_layers.clear();
  ZR_RETURN_IF_ERROR(in.Validate());
  const ShardManagerOptions& options = in.manager;
  MemoryEstimate out;
  std::vector<Unit> units;
  StageUnits stage;
  for (size_t i = 0; i < decoder.units.size(); ++i) {
    ParamSpec spec;
    spec.name = StrCat("unit", i);
    spec.shape = {decoder.units[i]};
    ZR_ASSIGN_OR_RETURN(const int u, AddUnit(in, options, {spec}, units, out));
    if (i == 0) {
      stage.embedding = u;
    } else if (decoder.has_norm && i + 1 == decoder.units.size()) {
      stage.norm = u;
    } else {
      stage.blocks.push_back(u);
    }
  }
  stage.boundaries = decoder.blocks + 1;
  StepModel model(in, std::move(units), std::move(stage), out, /*model_states_only=*/true);
  model.Run();
  return out;
}

}  // namespace zerort
