// ShardedOptimizer: master, moments and gradient shards on their tier; accumulation, norm, step.
#include "zerort/sharding/sharded_optimizer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>

#include "zerort/kernels/cast.h"
#include "zerort/kernels/onebit.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/scoped_seconds.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/host_gradient_queue.h"
#include "zerort/sharding/nvme_step.h"
#include "zerort/sharding/optimizer_state.h"

namespace zerort {

using optimizer_internal::HostF32;
using optimizer_internal::kPage;

ShardedOptimizer::ShardedOptimizer(const OptimizerResources& resources) : resources_(resources) {
  if (resources_.options->optimizer.kind == OptimizerKind::kZeroOneAdam) {
    zero_one_ = std::make_unique<ZeroOneSchedule>(resources_.options->optimizer);
  }
}

ShardedOptimizer::~ShardedOptimizer() {
  step_worker_.reset();  // runs the deferred updates submitted (they use the units' state)
  deferred_.reset();     // waits for its copies before their staging goes
  host_grads_.reset();   // waits for the copies still in flight before their buffers go
  if (staging_) ZR_CHECK_OK(staging_->Drain());
}

int ShardedOptimizer::IndexOf(const ShardedUnit& unit) const {
  auto it = index_.find(&unit);
  ZR_CHECK(it != index_.end()) << "unit '" << unit.name() << "' unknown to the optimizer";
  return it->second;
}

PlacedBuffer* ShardedOptimizer::Buffer(int u, StateKind kind) {
  UnitState& s = *units_.at(u);
  PlacedBuffer* b = kind == StateKind::kMaster     ? &s.master
                    : kind == StateKind::kExpAvg   ? &s.exp_avg
                    : kind == StateKind::kExpAvgSq ? &s.exp_avg_sq
                                                   : &s.exp_avg_sq_fresh;
  return *b ? b : nullptr;
}

StatusOr<TensorView> ShardedOptimizer::AddUnit(ShardedUnit& unit, std::span<const float> initial) {
  const UnitPlan& plan = unit.plan();
  const int64_t shard = unit.layout().shard_numel();
  ZR_CHECK(static_cast<int64_t>(initial.size()) == shard) << "unit '" << unit.name() << "'";
  auto state = std::make_unique<UnitState>();
  state->unit = &unit;
  auto allocate = [&](PlacedBuffer& b, UnitBuffer which) -> Status {
    const PlannedBuffer* p = plan.Find(which);
    if (p == nullptr) return absl::OkStatus();
    StatusOr<PlacedBuffer> placed =
        PlacedBuffer::Allocate(*p, resources_.tiers, resources_.compute);
    if (!placed.ok()) return Annotate(placed.status(), StrCat("unit '", unit.name(), "'"));
    b = std::move(*placed);
    return absl::OkStatus();
  };
  // In plan order (the memory model replays the same order).
  ZR_RETURN_IF_ERROR(allocate(state->master, UnitBuffer::kMaster));
  const int u = static_cast<int>(units_.size());
  units_.push_back(std::move(state));
  index_[&unit] = u;
  ZR_RETURN_IF_ERROR(WriteState(u, StateKind::kMaster, initial));
  UnitState& s = *units_.back();
  ZR_RETURN_IF_ERROR(allocate(s.exp_avg, UnitBuffer::kExpAvg));
  ZR_RETURN_IF_ERROR(allocate(s.exp_avg_sq, UnitBuffer::kExpAvgSq));
  ZR_RETURN_IF_ERROR(allocate(s.grad, UnitBuffer::kGradShard));
  ZR_RETURN_IF_ERROR(allocate(s.worker_error, UnitBuffer::kWorkerError));
  ZR_RETURN_IF_ERROR(allocate(s.server_error, UnitBuffer::kServerError));
  ZR_RETURN_IF_ERROR(allocate(s.accumulator, UnitBuffer::kAccumulator));
  ZR_RETURN_IF_ERROR(allocate(s.exp_avg_sq_fresh, UnitBuffer::kExpAvgSqFresh));
  if (resources_.options->optimizer.kind == OptimizerKind::kOneBitLamb) {
    s.lamb.resize(unit.layout().params().size());
  }
  if (s.master.in_memory()) return s.master.View();
  return TensorView(const_cast<float*>(initial.data()), DType::kF32, {shard}, Device::Cpu());
}

int64_t NvmeChunkNumel(const ShardManagerOptions& o, int64_t largest_shard) {
  // sub_group_size 0 (DeepSpeed: a sub-group per parameter): one chunk per unit's shard.
  const int64_t limit = o.offload.sub_group_size == 0 ? largest_shard : o.offload.sub_group_size;
  return RoundUp(std::min(largest_shard, std::max<int64_t>(limit, 1)), kReduceChunk);
}

int64_t NvmeStagingSetBytes(const ShardManagerOptions& o, int64_t chunk_numel) {
  const int64_t csize = static_cast<int64_t>(DTypeSize(o.compute_dtype));
  return 4 * RoundUp(chunk_numel * 4, kPage) + RoundUp(chunk_numel * csize, kPage);
}

Status ShardedOptimizer::Finalize() {
  if (resources_.options->optimizer.kind == OptimizerKind::kOneBitLamb && !fused_) {
    int64_t numel = 0;
    for (const auto& s : units_) {
      fused_at_.push_back(numel);
      for (const ShardPiece& piece : s->unit->layout().ShardPieces(s->unit->layout_rank())) {
        numel += piece.shard_range.size();
      }
    }
    for (const PlannedBuffer& p :
         PlanRankBuffers(*resources_.options, numel, resources_.dp->size())) {
      PlacedBuffer& b = p.buffer == UnitBuffer::kFusedMomentum ? fused_
                        : p.buffer == UnitBuffer::kWorkerError ? fused_worker_error_
                                                               : fused_server_error_;
      StatusOr<PlacedBuffer> placed =
          PlacedBuffer::Allocate(p, resources_.tiers, resources_.compute);
      if (!placed.ok()) return Annotate(placed.status(), "1-bit LAMB's fused momentum");
      b = std::move(*placed);
    }
    return ZeroErrors(true);
  }
  if (placement() != MemoryTier::kNvme || staging_) return absl::OkStatus();
  const ShardManagerOptions& o = *resources_.options;
  int64_t largest = 0;
  for (const auto& s : units_) largest = std::max(largest, s->unit->layout().shard_numel());
  chunk_numel_ = NvmeChunkNumel(o, largest);
  const int64_t set_bytes = NvmeStagingSetBytes(o, chunk_numel_);
  StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::Create(*resources_.tiers.host, std::max(o.offload.optimizer_buffer_count, 2),
                          static_cast<size_t>(set_bytes));
  if (!pool.ok()) {
    return Annotate(pool.status(),
                    "offload_optimizer staging sets (buffer_count x sub_group_size chunks)");
  }
  staging_ = std::move(*pool);
  return absl::OkStatus();
}

// ------------------------------------------------------------------ gradients and norm

Status ShardedOptimizer::AccumulateGradient(const ShardedUnit& unit, const TensorView& reduced,
                                            Stream& stream) {
  const int u = IndexOf(unit);
  UnitState& s = *units_[u];
  if (s.grad.tier() == MemoryTier::kDevice) {
    return AccumulateInto(reduced, s.grad.View(), &stream);
  }
  if (!stream.asynchronous()) {
    // The synchronous CPU device: the reduction has run, its output is host memory.
    return AddHostGradient(u, reduced);
  }
  // CUDA or cpu-async: [Note: host gradients in flight].
  ZR_ASSIGN_OR_RETURN(::zerort::Buffer staged, resources_.tiers.StagingOrHost()->Allocate(
                                                   reduced.nbytes(), MemoryCategory::kStaging));
  ZR_RETURN_IF_ERROR(CopyBytes(staged.data(), Device::Cpu(), reduced.data(), reduced.device(),
                               reduced.nbytes(), &stream));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> copied, CreateEvent(stream.device()));
  ZR_RETURN_IF_ERROR(copied->Record(stream));
  if (!host_grads_) {
    host_grads_ = std::make_unique<HostGradientQueue>(
        [this](int unit, const TensorView& host) { return AddHostGradient(unit, host); });
  }
  return host_grads_->Push(u, std::move(staged), reduced.dtype(), reduced.numel(),
                           std::move(copied));
}

Status ShardedOptimizer::AddHostGradient(int u, const TensorView& host) {
  UnitState& s = *units_[u];
  if (!s.grad.in_memory()) return AccumulateNvme(u, host);
  // [Note: host gradient shards start stale]: the step's first slice writes the shard.
  const bool assign = std::exchange(s.grad_stale, false);
  // [Note: the norm taken by the last add]: the add the last step's count says is the last.
  s.norm_taken = ++s.adds == s.adds_last_step;
  if (!s.norm_taken) {
    return assign ? AssignInto(host, s.grad.View(), nullptr)
                  : AccumulateInto(host, s.grad.View(), nullptr);
  }
  StatusOr<float> sum_sq =
      HostAccumulateWithSumOfSquares(host, s.grad.View(), assign, NormRanges(u));
  if (!sum_sq.ok()) {
    s.norm_taken = false;
    return sum_sq.status();
  }
  s.sum_sq = *sum_sq;
  return absl::OkStatus();
}

TensorView ShardedOptimizer::GradView(int u) {
  UnitState& s = *units_[u];
  if (std::exchange(s.grad_stale, false)) {  // read before any slice of this step came
    const TensorView g = s.grad.View();
    ZR_CHECK_OK(FillZero(g.data(), g.device(), g.nbytes(), nullptr));
  }
  return s.grad.View();
}

Status ShardedOptimizer::FinishHostGradients() {
  if (!host_grads_) return absl::OkStatus();
  const Status added = host_grads_->Finish();
  if (resources_.stats != nullptr) {
    const HostGradientQueue::Seconds s = host_grads_->TakeSeconds();
    resources_.stats->grad_wait_s += s.wait_s;
    resources_.stats->grad_add_s += s.add_s;
  }
  return added;
}

// Read (unless this step has not written it yet), add, write, chunk by chunk; the norm parts are
// taken on the way, chained so that they equal one pass over the whole shard.
Status ShardedOptimizer::AccumulateNvme(int u, const TensorView& reduced) {
  ScopedSeconds timed(resources_.stats ? &resources_.stats->grad_io_s : nullptr);
  UnitState& s = *units_[u];
  NvmeStore& store = *resources_.tiers.nvme;
  const int64_t shard = s.grad.numel();
  double sum_sq = 0.0, nonfinite = 0.0;
  for (int64_t begin = 0; begin < shard; begin += chunk_numel_) {
    const int64_t n = std::min(chunk_numel_, shard - begin);
    ZR_ASSIGN_OR_RETURN(StagingPool::Lease lease, staging_->Acquire());
    const TensorView chunk = HostF32(lease.data, n);
    Status status = absl::OkStatus();
    if (s.grad_written) {
      status = store.StartRead(s.grad.region(), begin * 4, lease.data, n * 4).Finish();
    } else {
      std::memset(lease.data, 0, n * 4);
    }
    if (status.ok()) status = AccumulateInto(reduced.Flat(begin, n), chunk, nullptr);
    if (status.ok()) {
      for (const Range& r : NormRanges(u)) {  // the whole chunk unless replicated parts are out
        const int64_t b = std::max(r.begin, begin), e = std::min(r.end, begin + n);
        if (b < e) sum_sq = HostSumOfSquares(chunk.Flat(b - begin, e - b), sum_sq);
      }
      nonfinite = HostCountNonFinite(chunk, nonfinite);
      status = store.StartWrite(s.grad.region(), begin * 4, lease.data, n * 4).Finish();
    }
    staging_->Return(lease);
    if (!status.ok()) {
      return Annotate(status, StrCat("gradient shard of unit '", s.unit->name(), "'"));
    }
  }
  s.grad_written = true;
  s.sum_sq = static_cast<float>(sum_sq);
  s.nonfinite = static_cast<float>(nonfinite);
  return absl::OkStatus();
}

std::vector<Range> ShardedOptimizer::NormRanges(int u) const {
  const ShardedUnit& unit = *units_[u]->unit;
  const int64_t shard = unit.layout().shard_numel();
  if (!units_[u]->in_norm) return {};
  if (resources_.count_replicated) return {Range{0, shard}};
  std::vector<Range> ranges;
  for (const ShardPiece& piece : unit.layout().ShardPieces(unit.layout_rank())) {
    const GlobalFrame& f = unit.layout().params()[piece.param].frame;
    if (f.split_dim >= 0 && f.parts > 1) ranges.push_back(piece.shard_range);
  }
  return ranges;
}

Status ShardedOptimizer::SumOfSquaresOfNormRanges(int u, const TensorView& grad, int64_t offset,
                                                  const TensorView& out, Stream* stream) const {
  const int64_t end = offset + grad.numel();
  for (const Range& r : NormRanges(u)) {
    const int64_t b = std::max(r.begin, offset), e = std::min(r.end, end);
    if (b >= e) continue;
    ZR_RETURN_IF_ERROR(SumOfSquares(grad.Flat(b - offset, e - b), out, stream));
  }
  return absl::OkStatus();
}

MemoryTier ShardedOptimizer::tier(int u) const { return units_.at(u)->master.tier(); }
MemoryTier ShardedOptimizer::grad_tier(int u) const { return units_.at(u)->grad.tier(); }

Status ShardedOptimizer::AccumulateNorm(const TensorView& sum_sq, const TensorView& nonfinite) {
  ZR_RETURN_IF_ERROR(FinishHostGradients());
  const int n = static_cast<int>(units_.size());
  // The units whose gradient shard is on the device first (the device-tier units: all of them,
  // or the first of a partial offload, [Note: partial optimizer offload]; with [Note: gradient
  // sums on the device] every unit), by kernels adding into the sums on the compute stream.
  int first_host = 0;
  for (; first_host < n && grad_tier(first_host) == MemoryTier::kDevice; ++first_host) {
    const TensorView g = units_[first_host]->grad.View();
    ZR_RETURN_IF_ERROR(SumOfSquaresOfNormRanges(first_host, g, 0, sum_sq, resources_.compute));
    ZR_RETURN_IF_ERROR(CountNonFinite(g, nonfinite, resources_.compute));
  }
  if (first_host == n) return absl::OkStatus();
  // Host tiers: the same float additions, unit by unit, on the host, after the device's.
  float current[2];
  Stream* compute = resources_.compute;
  ZR_RETURN_IF_ERROR(
      CopyBytes(&current[0], Device::Cpu(), sum_sq.data(), sum_sq.device(), 4, compute));
  ZR_RETURN_IF_ERROR(
      CopyBytes(&current[1], Device::Cpu(), nonfinite.data(), nonfinite.device(), 4, compute));
  ZR_RETURN_IF_ERROR(compute->Synchronize());
  for (int u = first_host; u < n; ++u) {
    UnitState* s = units_[u].get();
    ZR_CHECK(grad_tier(u) != MemoryTier::kDevice)
        << "unit '" << s->unit->name() << "' has its gradient on the device after a unit whose "
        << "gradient is on the host";
    if (s->grad.in_memory()) {
      float part[2] = {0.0f, 0.0f};
      const TensorView g = GradView(u);
      int64_t in_norm = 0;
      for (const Range& r : NormRanges(u)) in_norm += r.size();
      if (s->norm_taken) {  // [Note: the norm taken by the last add]
        part[0] = s->sum_sq;
      } else {
        ZR_RETURN_IF_ERROR(SumOfSquaresOfNormRanges(u, g, 0, HostF32(&part[0], 1), nullptr));
        if (resources_.stats != nullptr && in_norm > 0) ++resources_.stats->norm_passes;
      }
      // A finite sum of squares over the whole shard has no inf or NaN among its terms: the
      // count is 0 without a second pass over the shard (4 bytes a parameter on the way from the
      // last backward to the host step). Otherwise, or when replicated pieces are out of the
      // norm, the count's own pass: its value is the same either way.
      if (in_norm != g.numel() || !std::isfinite(part[0])) {
        ZR_RETURN_IF_ERROR(CountNonFinite(g, HostF32(&part[1], 1), nullptr));
      }
      current[0] += part[0];
      current[1] += part[1];
    } else if (s->grad_written) {
      current[0] += s->sum_sq;
      current[1] += s->nonfinite;
    }
  }
  ZR_RETURN_IF_ERROR(
      CopyBytes(sum_sq.data(), sum_sq.device(), &current[0], Device::Cpu(), 4, compute));
  ZR_RETURN_IF_ERROR(
      CopyBytes(nonfinite.data(), nonfinite.device(), &current[1], Device::Cpu(), 4, compute));
  return compute->Synchronize();
}

Status ShardedOptimizer::ZeroGradients() {
  ZR_RETURN_IF_ERROR(FinishHostGradients());
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) ZR_RETURN_IF_ERROR(ZeroGradient(u));
  return absl::OkStatus();
}

Status ShardedOptimizer::ZeroGradient(int u, bool fill_device) {
  UnitState& s = *units_[u];
  if (s.grad.tier() != MemoryTier::kDevice && s.grad.in_memory()) {
    s.grad_stale = true;  // [Note: host gradient shards start stale]: no fill
  } else if (s.grad.in_memory() && fill_device) {
    const TensorView g = s.grad.View();
    ZR_RETURN_IF_ERROR(FillZero(g.data(), g.device(), g.nbytes(), StreamFor(s.grad.tier())));
  }
  s.grad_written = false;
  s.sum_sq = s.nonfinite = 0.0f;
  s.norm_taken = false;
  s.adds_last_step = std::exchange(s.adds, 0);
  return absl::OkStatus();
}

// ------------------------------------------------------------------ the step

Status ShardedOptimizer::Update(int u, const Range& range, const OptimizerStepArgs& args,
                                const TensorView& master, const TensorView& grad,
                                const TensorView& exp_avg, const TensorView& exp_avg_sq,
                                const TensorView& out) {
  const ShardManagerOptions& o = *resources_.options;
  const OptimizerOptions& opt = o.optimizer;
  const FlatLayout& layout = units_[u]->unit->layout();
  Stream* stream = StreamFor(tier(u));
  // Adam and AdamW: the range's parameter pieces in one call (one CUDA launch per
  // kAdamSegmentsPerLaunch pieces), each with its parameter's weight decay.
  std::vector<OptimizerSegment> segments;
  for (const ShardPiece& piece : layout.ShardPieces(units_[u]->unit->layout_rank())) {
    const Range r{std::max(piece.shard_range.begin, range.begin),
                  std::min(piece.shard_range.end, range.end)};
    if (r.begin >= r.end) continue;
    const int64_t at = r.begin - range.begin, n = r.size();
    auto part = [&](const TensorView& v) { return v.data() ? v.Flat(at, n) : TensorView(); };
    const float wd = layout.params()[piece.param].weight_decay ? opt.weight_decay : 0.0f;
    if (opt.kind == OptimizerKind::kSgd) {
      const SgdHyper h{.lr = args.lr,
                       .momentum = opt.momentum,
                       .dampening = opt.dampening,
                       .weight_decay = wd,
                       .nesterov = opt.nesterov,
                       .step = args.step,
                       .grad_scale = args.grad_scale};
      ZR_RETURN_IF_ERROR(SgdStep(h, part(master), part(grad), part(exp_avg), part(out), stream));
    } else {
      segments.push_back({.begin = at, .count = n, .weight_decay = wd});
    }
  }
  if (!segments.empty()) {
    const AdamHyper h{.lr = args.lr,
                      .beta1 = opt.beta1,
                      .beta2 = opt.beta2,
                      .eps = opt.eps,
                      .decoupled = opt.kind == OptimizerKind::kAdamW,
                      .step = args.step,
                      .grad_scale = args.grad_scale,
                      .bias_correction = opt.bias_correction};
    ZR_RETURN_IF_ERROR(
        AdamStepSegments(h, segments, master, grad, exp_avg, exp_avg_sq, out, stream));
  }
  return absl::OkStatus();
}

StatusOr<StepCompletion> ShardedOptimizer::Step(const OptimizerStepArgs& args) {
  ZR_RETURN_IF_ERROR(FinishHostGradients());
  if (deferred_) {  // the last deferred step: every unit completed, its copies landed
    ZR_CHECK(deferred_->completed == static_cast<int>(units_.size()))
        << "optimizer step while the last step's unit "
        << units_[deferred_->completed]->unit->name() << " is not completed";
    ZR_RETURN_IF_ERROR(deferred_->write_backs.Drain(0));
    deferred_.reset();
  }
  if (DefersStep()) {  // [Note: the host step behind the forward]
    deferred_ = std::make_unique<DeferredStep>();
    deferred_->args = args;
    deferred_->units.resize(units_.size());
    if (resources_.sums != nullptr) {  // [Note: gradient sums on the device]
      ZR_ASSIGN_OR_RETURN(deferred_->grads_final, CreateEvent(resources_.compute->device()));
      ZR_RETURN_IF_ERROR(deferred_->grads_final->Record(*resources_.compute));
    }
    const int ahead = Ahead();  // host-tier units submitted before the first completion
    for (int queued = 0; queued < ahead; ++queued) ZR_RETURN_IF_ERROR(SubmitDeferred());
    // [Note: partial optimizer offload]: the device-tier units are updated here, by kernels on
    // the compute stream ahead of the next forward's, and their shards zeroed after, while the
    // worker takes the host-tier ones. A compute shard on the host (offload_param) is copied
    // back before the step returns: a unit's completion does not wait for it.
    WriteBacks device_copies;
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      if (tier(u) != MemoryTier::kDevice) continue;
      ZR_RETURN_IF_ERROR(StepInMemory(u, args, device_copies));
      ZR_RETURN_IF_ERROR(ZeroGradient(u));
    }
    ZR_RETURN_IF_ERROR(device_copies.Drain(0));
    return StepCompletion::kPerUnit;
  }
  ScopedSeconds timed(resources_.stats && placement() != MemoryTier::kDevice
                          ? &resources_.stats->optimizer_s
                          : nullptr);
  if (placement() == MemoryTier::kNvme) {
    if (resources_.options->optimizer.kind == OptimizerKind::kLamb) {
      return absl::UnimplementedError(
          "LAMB with the optimizer state on NVMe is not implemented (its per-parameter norms "
          "need a second pass over the streamed chunks); use offload_optimizer.device cpu");
    }
    ZR_RETURN_IF_ERROR(StepNvme(args));
    return StepCompletion::kDone;
  }
  if (resources_.options->optimizer.kind == OptimizerKind::kOneBitLamb &&
      OneBitCompressing(resources_.options->optimizer, args.step)) {
    ZR_RETURN_IF_ERROR(CompressLambMomentum(args));
  }
  if (zero_one_) {  // [Note: 0/1 Adam]: this step's place in DeepSpeed's counters
    ZR_CHECK(zero_one_->steps() == args.step - 1)
        << "0/1 Adam's schedule is at step " << zero_one_->steps() << ", stepping " << args.step;
    zero_one_step_ = zero_one_->Next();
    if (zero_one_step_.reset_errors) ZR_RETURN_IF_ERROR(ZeroErrors(false));
    if (zero_one_step_.frozen) lrs_ += args.lr;
  }
  const bool traced = resources_.span != nullptr && *resources_.span;
  WriteBacks write_backs;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const auto begin =
        traced ? std::chrono::system_clock::now() : std::chrono::system_clock::time_point();
    ZR_RETURN_IF_ERROR(StepInMemory(u, args, write_backs));
    if (traced) {  // the host's time: on a queued or CUDA stream, the issue
      const Stream* s = StreamFor(tier(u));
      (*resources_.span)(StrCat("optimizer ", units_[u]->unit->name()),
                         s != nullptr ? s->name() : "host", begin,
                         std::chrono::system_clock::now());
    }
  }
  ZR_RETURN_IF_ERROR(write_backs.Drain(0));
  if (zero_one_) {
    if (zero_one_step_.sync) lrs_ = 0;
    zero_one_->Advance();
  }
  return StepCompletion::kDone;
}

StatusOr<TensorView> ShardedOptimizer::UpdateTarget(int u, ::zerort::Buffer* staged) {
  UnitState& s = *units_[u];
  const int64_t shard = s.master.numel();
  const ComputeCopy copy = s.unit->compute_copy();
  if (copy.buffer == nullptr) return TensorView();
  ZR_CHECK(copy.buffer->in_memory()) << "an NVMe compute shard needs NVMe optimizer state";
  const TensorView target = copy.buffer->View().Flat(copy.offset, shard);
  const Device updates_on = s.master.View().device();
  if (target.device() == updates_on) return target;
  // Staged where the update runs: pinned host memory for a host-tier unit, device memory for a
  // device-tier one whose compute shard is on the host (offload_param without the optimizer, or
  // a partial offload's device units: [Note: partial optimizer offload]).
  if (tier(u) == MemoryTier::kDevice) {
    ZR_ASSIGN_OR_RETURN(*staged,
                        resources_.tiers.device->Allocate(target.nbytes(), MemoryCategory::kStaging,
                                                          resources_.compute));
  } else {
    ZR_ASSIGN_OR_RETURN(*staged, resources_.tiers.StagingOrHost()->Allocate(
                                     target.nbytes(), MemoryCategory::kStaging));
  }
  return TensorView(staged->data(), target.dtype(), {shard}, updates_on);
}

bool ShardedOptimizer::GradOnDevice(int u) const {
  return tier(u) != MemoryTier::kDevice && grad_tier(u) == MemoryTier::kDevice;
}

StatusOr<TensorView> ShardedOptimizer::StageGradient(int u, ::zerort::Buffer* staged,
                                                     Stream& stream, bool then_zero) {
  const TensorView g = units_[u]->grad.View();
  ZR_ASSIGN_OR_RETURN(
      *staged, resources_.tiers.StagingOrHost()->Allocate(g.nbytes(), MemoryCategory::kStaging));
  ZR_RETURN_IF_ERROR(
      CopyBytes(staged->data(), Device::Cpu(), g.data(), g.device(), g.nbytes(), &stream));
  if (then_zero) ZR_RETURN_IF_ERROR(FillZero(g.data(), g.device(), g.nbytes(), &stream));
  return TensorView(staged->data(), DType::kF32, {g.numel()}, Device::Cpu());
}

Status ShardedOptimizer::UpdateUnit(int u, const OptimizerStepArgs& args, const TensorView& out,
                                    const TensorView& grad) {
  UnitState& s = *units_[u];
  auto view = [](PlacedBuffer& b) { return b ? b.View() : TensorView(); };
  switch (resources_.options->optimizer.kind) {
    case OptimizerKind::kOneBitAdam:
      return UpdateOneBit(u, args, out);
    case OptimizerKind::kZeroOneAdam:
      return UpdateZeroOne(u, args, zero_one_step_, out);
    case OptimizerKind::kOneBitLamb:
      return UpdateOneBitLamb(u, args, out);
    case OptimizerKind::kLamb:
      return UpdateLamb(u, args, s.master.View(), grad, view(s.exp_avg), view(s.exp_avg_sq), out);
    default:
      return Update(u, Range{0, s.master.numel()}, args, s.master.View(), grad, view(s.exp_avg),
                    view(s.exp_avg_sq), out);
  }
}

Status ShardedOptimizer::IssueWriteBack(int u, ::zerort::Buffer staged, WriteBacks& write_backs,
                                        size_t keep) {
  const UnitState& s = *units_[u];
  const ComputeCopy copy = s.unit->compute_copy();
  const TensorView target = copy.buffer->View().Flat(copy.offset, s.master.numel());
  Stream& compute = *resources_.compute;
  ZR_RETURN_IF_ERROR(CopyBytes(target.data(), target.device(), staged.data(),
                               s.master.View().device(), target.nbytes(), &compute));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> copied, CreateEvent(compute.device()));
  const Status recorded = copied->Record(compute);
  if (!recorded.ok()) {
    (void)compute.Synchronize();  // the copy reads `staged` until then
    return recorded;
  }
  write_backs.Push({std::move(staged), std::move(copied)});
  return write_backs.Drain(keep);
}

Status ShardedOptimizer::StepInMemory(int u, const OptimizerStepArgs& args,
                                      WriteBacks& write_backs) {
  ::zerort::Buffer staged;  // the compute values on their way to another device (CUDA)
  ZR_ASSIGN_OR_RETURN(const TensorView out, UpdateTarget(u, &staged));
  ::zerort::Buffer grad_staged;  // [Note: gradient sums on the device]: zeroed by ZeroGradients
  TensorView grad;
  if (GradOnDevice(u)) {
    ZR_ASSIGN_OR_RETURN(grad, StageGradient(u, &grad_staged, *resources_.compute, false));
    ZR_RETURN_IF_ERROR(resources_.compute->Synchronize());
  } else {
    grad = GradView(u);
  }
  ZR_RETURN_IF_ERROR(UpdateUnit(u, args, out, grad));
  if (!staged) return absl::OkStatus();
  return IssueWriteBack(u, std::move(staged), write_backs, kWriteBacksInFlight);
}

Status ShardedOptimizer::StepNvme(const OptimizerStepArgs& args) {
  return NvmeStep(*this, args).Run();
}

// ------------------------------------------------------------------ checkpoint state

bool ShardedOptimizer::HasState(StateKind kind) const {
  if (units_.empty()) return false;
  const UnitState& s = *units_[0];
  return kind == StateKind::kMaster     ? static_cast<bool>(s.master)
         : kind == StateKind::kExpAvg   ? static_cast<bool>(s.exp_avg)
         : kind == StateKind::kExpAvgSq ? static_cast<bool>(s.exp_avg_sq)
                                        : static_cast<bool>(s.exp_avg_sq_fresh);
}

Status ShardedOptimizer::ReadState(int u, StateKind kind, std::span<float> out) {
  ZR_RETURN_IF_ERROR(CompleteUnitStep(u));  // [Note: the host step behind the forward]
  PlacedBuffer* b = Buffer(u, kind);
  if (b == nullptr) return absl::FailedPreconditionError("the optimizer keeps no such state");
  if (static_cast<int64_t>(out.size()) != b->numel()) {
    return absl::InvalidArgumentError(
        StrCat("ReadState into ", out.size(), " values, shard of ", b->numel()));
  }
  if (b->in_memory()) {
    const TensorView v = b->View();
    Stream* stream = StreamFor(b->tier());
    ZR_RETURN_IF_ERROR(
        CopyBytes(out.data(), Device::Cpu(), v.data(), v.device(), v.nbytes(), stream));
    return stream != nullptr ? stream->Synchronize() : absl::OkStatus();
  }
  ZR_ASSIGN_OR_RETURN(AlignedHostBuffer staged,
                      AllocateAligned(*resources_.tiers.host, b->bytes()));
  ZR_RETURN_IF_ERROR(
      resources_.tiers.nvme->StartRead(b->region(), 0, staged.data, b->bytes()).Finish());
  std::memcpy(out.data(), staged.data, b->bytes());
  return absl::OkStatus();
}

Status ShardedOptimizer::WriteState(int u, StateKind kind, std::span<const float> values) {
  ZR_RETURN_IF_ERROR(CompleteUnitStep(u));
  PlacedBuffer* b = Buffer(u, kind);
  if (b == nullptr) return absl::FailedPreconditionError("the optimizer keeps no such state");
  if (static_cast<int64_t>(values.size()) != b->numel()) {
    return absl::InvalidArgumentError(StrCat("WriteState of unit '", units_[u]->unit->name(), "': ",
                                             values.size(), " values for a shard of ", b->numel()));
  }
  if (b->in_memory()) {
    const TensorView v = b->View();
    Stream* stream = StreamFor(b->tier());
    ZR_RETURN_IF_ERROR(
        CopyBytes(v.data(), v.device(), values.data(), Device::Cpu(), v.nbytes(), stream));
    if (stream != nullptr) ZR_RETURN_IF_ERROR(stream->Synchronize());
  } else {
    ZR_ASSIGN_OR_RETURN(AlignedHostBuffer staged,
                        AllocateAligned(*resources_.tiers.host, b->bytes()));
    std::memcpy(staged.data, values.data(), b->bytes());
    ZR_RETURN_IF_ERROR(
        resources_.tiers.nvme->StartWrite(b->region(), 0, staged.data, b->bytes()).Finish());
  }
  return absl::OkStatus();
}

void ShardedOptimizer::ExcludeFromNorm(int u) { units_.at(u)->in_norm = false; }

TensorView ShardedOptimizer::GradShard(int u) {
  units_.at(u)->norm_taken = false;  // the caller may write the shard
  return units_.at(u)->grad.in_memory() ? GradView(u) : TensorView();
}

}  // namespace zerort
