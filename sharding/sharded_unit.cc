// ShardedUnit: buffers, the shard state machine, gradient reduction and the optimizer step.
#include "sharding/sharded_unit.h"

#include "kernels/cast.h"
#include "kernels/optimizer.h"
#include "kernels/reduce.h"
#include "runtime/strings.h"

namespace zerort {

std::string_view ShardStateName(ShardState state) {
  switch (state) {
    case ShardState::kSharded:
      return "SHARDED";
    case ShardState::kGathering:
      return "GATHERING";
    case ShardState::kUnsharded:
      return "UNSHARDED";
  }
  return "invalid";
}

StatusOr<std::unique_ptr<ShardedUnit>> ShardedUnit::Create(std::string name,
                                                           std::vector<ParamSpec> params,
                                                           const UnitResources& r) {
  if (r.options == nullptr || r.dp == nullptr || r.device == nullptr || r.compute == nullptr ||
      r.comm == nullptr) {
    return absl::InvalidArgumentError(StrCat("unit '", name, "': missing resources"));
  }
  // Stage 0 does not shard: one "shard" holding everything, replicated on every rank.
  const int shards = r.options->stage == ZeroStage::k0 ? 1 : r.dp->size();
  StatusOr<FlatLayout> layout = FlatLayout::Create(std::move(params), shards, r.options->alignment);
  if (!layout.ok()) return Annotate(layout.status(), StrCat("unit '", name, "'"));
  return std::unique_ptr<ShardedUnit>(new ShardedUnit(std::move(name), std::move(*layout), r));
}

ShardedUnit::ShardedUnit(std::string name, FlatLayout layout, const UnitResources& resources)
    : name_(std::move(name)), layout_(std::move(layout)), resources_(resources) {
  rank_ = layout_.dp_size() == 1 ? 0 : resources_.dp->rank();
}

ShardedUnit::~ShardedUnit() = default;

int64_t ShardedUnit::gathered_bytes() const {
  return layout_.padded_numel() * static_cast<int64_t>(DTypeSize(options().compute_dtype));
}

Status ShardedUnit::Allocate(Buffer* buffer, size_t bytes, MemoryCategory category, Stream* stream,
                             MemoryTier tier) {
  // ShardManager::Create refuses other placements until the offload tier exists.
  ZR_CHECK(tier == MemoryTier::kDevice) << "unit '" << name_ << "': tier " << MemoryTierName(tier);
  StatusOr<Buffer> b = resources_.device->Allocate(bytes, category, stream);
  if (!b.ok()) return Annotate(b.status(), StrCat("unit '", name_, "'"));
  *buffer = std::move(*b);
  return FillZero(buffer->data(), device(), bytes, stream);
}

TensorView ShardedUnit::MasterShard() const {
  return TensorView(master_.data(), DType::kF32, {layout_.shard_numel()}, device());
}

TensorView ShardedUnit::GradShard() const {
  return TensorView(grad_shard_.data(), DType::kF32, {layout_.shard_numel()}, device());
}

TensorView ShardedUnit::ComputeFlat() const {
  const ShardManagerOptions& o = options();
  void* data = o.stage == ZeroStage::k3 ? gathered_.data()
               : (o.stage == ZeroStage::k0 && o.compute_dtype == DType::kF32)
                   ? master_.data()
                   : compute_full_.data();
  return TensorView(data, o.compute_dtype, {layout_.padded_numel()}, device());
}

Status ShardedUnit::Initialize(const Initializer& init) {
  ZR_CHECK(!initialized_) << "unit '" << name_ << "' initialised twice";
  const ShardManagerOptions& o = options();
  const int64_t shard = layout_.shard_numel();
  const int64_t padded = layout_.padded_numel();
  Stream* compute = resources_.compute;

  // The master shard, from whole parameters generated identically on every rank.
  std::vector<float> host_shard(static_cast<size_t>(shard), 0.0f);
  for (const ShardPiece& piece : layout_.ShardPieces(rank_)) {
    const ParamSpec& spec = layout_.params()[piece.param];
    std::vector<float> full(static_cast<size_t>(spec.numel()));
    init(spec, o.seed, full);
    std::copy(full.begin() + piece.param_range.begin, full.begin() + piece.param_range.end,
              host_shard.begin() + piece.shard_range.begin);
  }
  const ShardPlacement& at = o.placement;
  ZR_RETURN_IF_ERROR(
      Allocate(&master_, shard * 4, MemoryCategory::kParameters, compute, at.master));
  ZR_RETURN_IF_ERROR(
      CopyBytes(master_.data(), device(), host_shard.data(), Device::Cpu(), shard * 4, compute));

  const bool adam = o.optimizer.kind != OptimizerKind::kSgd;
  if (adam || o.optimizer.momentum != 0.0f) {
    ZR_RETURN_IF_ERROR(Allocate(&exp_avg_, shard * 4, MemoryCategory::kOptimizerState, compute,
                                at.optimizer_state));
  }
  if (adam) {
    ZR_RETURN_IF_ERROR(Allocate(&exp_avg_sq_, shard * 4, MemoryCategory::kOptimizerState, compute,
                                at.optimizer_state));
  }
  ZR_RETURN_IF_ERROR(Allocate(&grad_shard_, shard * 4, MemoryCategory::kGradients, compute));

  const size_t csize = DTypeSize(o.compute_dtype);
  switch (o.stage) {
    case ZeroStage::k3:
      ZR_RETURN_IF_ERROR(Allocate(&compute_shard_, shard * csize, MemoryCategory::kParameters,
                                  compute, at.compute_shard));
      ZR_RETURN_IF_ERROR(Cast(MasterShard(),
                              TensorView(compute_shard_.data(), o.compute_dtype, {shard}, device()),
                              compute));
      persistent_ = layout_.padded_numel() < o.stage3_param_persistence_threshold;
      break;
    case ZeroStage::k1:
    case ZeroStage::k2: {
      ZR_RETURN_IF_ERROR(
          Allocate(&compute_full_, padded * csize, MemoryCategory::kParameters, compute));
      TensorView own = ComputeFlat().Flat(rank_ * shard, shard);
      ZR_RETURN_IF_ERROR(Cast(MasterShard(), own, compute));
      ZR_RETURN_IF_ERROR(resources_.dp->AllGather(own.data(), compute_full_.data(), shard,
                                                  o.compute_dtype, compute));
      persistent_ = true;
      break;
    }
    case ZeroStage::k0:
      if (o.compute_dtype != DType::kF32) {
        ZR_RETURN_IF_ERROR(
            Allocate(&compute_full_, padded * csize, MemoryCategory::kParameters, compute));
        ZR_RETURN_IF_ERROR(Cast(MasterShard(), ComputeFlat(), compute));
      }
      persistent_ = true;
      break;
  }
  if (o.stage == ZeroStage::k0 || o.stage == ZeroStage::k1) {
    ZR_RETURN_IF_ERROR(Allocate(&full_grad_, padded * DTypeSize(o.reduce_dtype),
                                MemoryCategory::kGradients, compute));
  }
  ZR_ASSIGN_OR_RETURN(gathered_event_, CreateEvent(device()));
  initialized_ = true;
  if (o.stage != ZeroStage::k3) {
    state_ = ShardState::kUnsharded;
  } else if (persistent_) {
    persistent_ = false;  // gather through the ordinary path once, then keep it
    ZR_RETURN_IF_ERROR(StartGather());
    ZR_RETURN_IF_ERROR(FinishGather());
    persistent_ = true;
  }
  return absl::OkStatus();
}

Status ShardedUnit::StartGather() {
  ZR_CHECK(initialized_ && sharded_params() && !persistent_ && state_ == ShardState::kSharded)
      << "StartGather on unit '" << name_ << "' in state " << ShardStateName(state_)
      << (persistent_ ? " (persistent)" : "");
  const ShardManagerOptions& o = options();
  Stream* comm = resources_.comm;
  // The compute shard was last written on the compute stream (optimizer step).
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> written, CreateEvent(device()));
  ZR_RETURN_IF_ERROR(written->Record(*resources_.compute));
  ZR_RETURN_IF_ERROR(comm->WaitEvent(*written));
  StatusOr<Buffer> gathered =
      resources_.device->Allocate(gathered_bytes(), MemoryCategory::kGatheredWeights, comm);
  if (!gathered.ok()) return Annotate(gathered.status(), StrCat("gathering unit '", name_, "'"));
  gathered_ = std::move(*gathered);
  resources_.dp->SetTraceLabel(StrCat("gather ", name_));
  ZR_RETURN_IF_ERROR(resources_.dp->AllGather(compute_shard_.data(), gathered_.data(),
                                              layout_.shard_numel(), o.compute_dtype, comm));
  resources_.dp->SetTraceLabel("");
  ZR_RETURN_IF_ERROR(gathered_event_->Record(*comm));
  state_ = ShardState::kGathering;
  return absl::OkStatus();
}

Status ShardedUnit::FinishGather() {
  if (state_ == ShardState::kUnsharded) return absl::OkStatus();
  ZR_CHECK(state_ == ShardState::kGathering)
      << "FinishGather on unit '" << name_ << "' in state " << ShardStateName(state_);
  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*gathered_event_));
  ZR_RETURN_IF_ERROR(resources_.device->RecordStream(gathered_, *resources_.compute));
  state_ = ShardState::kUnsharded;
  return absl::OkStatus();
}

Status ShardedUnit::Release() {
  if (persistent_) return absl::OkStatus();
  ZR_CHECK(state_ == ShardState::kUnsharded)
      << "Release of unit '" << name_ << "' in state " << ShardStateName(state_);
  gathered_.Reset();  // reused only once the compute stream has finished reading it
  state_ = ShardState::kSharded;
  return absl::OkStatus();
}

TensorView ShardedUnit::Param(int i) const {
  ZR_CHECK(state_ == ShardState::kUnsharded)
      << "parameter " << i << " of unit '" << name_ << "' read in state " << ShardStateName(state_);
  const Range flat = layout_.flat_range(i);
  return ComputeFlat().Flat(flat.begin, flat.size()).Reshape(layout_.params()[i].shape);
}

TensorView ShardedUnit::Grad(int i) const {
  ZR_CHECK(full_grad_) << "gradient of unit '" << name_ << "' outside its backward";
  const Range flat = layout_.flat_range(i);
  return TensorView(full_grad_.data(), options().reduce_dtype, {layout_.padded_numel()}, device())
      .Flat(flat.begin, flat.size())
      .Reshape(layout_.params()[i].shape);
}

Status ShardedUnit::BeginBackward() {
  const ShardManagerOptions& o = options();
  if (o.stage == ZeroStage::k0 || o.stage == ZeroStage::k1) return absl::OkStatus();  // persistent
  // Still waiting in a reduce bucket from an earlier micro-batch: keep accumulating into it.
  if (full_grad_) return absl::OkStatus();
  return Allocate(&full_grad_, layout_.padded_numel() * DTypeSize(o.reduce_dtype),
                  MemoryCategory::kGradients, resources_.compute);
}

TensorView ShardedUnit::FullGrad() const {
  ZR_CHECK(full_grad_) << "full gradient of unit '" << name_ << "' outside its backward";
  return TensorView(full_grad_.data(), options().reduce_dtype, {layout_.padded_numel()}, device());
}

Status ShardedUnit::DropFullGrad(Stream& used_on) {
  ZR_CHECK(full_grad_) << "DropFullGrad of unit '" << name_ << "' without a full gradient";
  ZR_RETURN_IF_ERROR(resources_.device->RecordStream(full_grad_, used_on));
  full_grad_.Reset();
  return absl::OkStatus();
}

Status ShardedUnit::TakeAllReducedGradient() {
  const ShardManagerOptions& o = options();
  ZR_CHECK(o.stage == ZeroStage::k0 || o.stage == ZeroStage::k1) << "unit '" << name_ << "'";
  Stream* compute = resources_.compute;
  const int64_t shard = layout_.shard_numel();
  ZR_RETURN_IF_ERROR(Cast(FullGrad().Flat(rank_ * shard, shard), GradShard(), compute));
  return FillZero(full_grad_.data(), device(), full_grad_.bytes(), compute);
}

Status ShardedUnit::AccumulateNorm(const TensorView& sum_sq, const TensorView& nonfinite) {
  ZR_RETURN_IF_ERROR(SumOfSquares(GradShard(), sum_sq, resources_.compute));
  return CountNonFinite(GradShard(), nonfinite, resources_.compute);
}

Status ShardedUnit::OptimizerStep(const OptimizerStepArgs& args) {
  const ShardManagerOptions& o = options();
  const OptimizerOptions& opt = o.optimizer;
  const int64_t shard = layout_.shard_numel();
  auto f32 = [&](const Buffer& b, const Range& r) {
    return TensorView(b.data(), DType::kF32, {shard}, device()).Flat(r.begin, r.size());
  };
  for (const ShardPiece& piece : layout_.ShardPieces(rank_)) {
    const float wd = layout_.params()[piece.param].weight_decay ? opt.weight_decay : 0.0f;
    TensorView out;  // null: no compute copy (stage 0 in fp32 computes from the master)
    if (o.stage == ZeroStage::k3) {
      out = TensorView(compute_shard_.data(), o.compute_dtype, {shard}, device())
                .Flat(piece.shard_range.begin, piece.shard_range.size());
    } else if (compute_full_) {
      out = ComputeFlat().Flat(rank_ * shard + piece.shard_range.begin, piece.shard_range.size());
    }
    const Range& r = piece.shard_range;
    if (opt.kind == OptimizerKind::kSgd) {
      const SgdHyper h{.lr = args.lr,
                       .momentum = opt.momentum,
                       .dampening = opt.dampening,
                       .weight_decay = wd,
                       .nesterov = opt.nesterov,
                       .step = args.step,
                       .grad_scale = args.grad_scale};
      TensorView momentum = exp_avg_ ? f32(exp_avg_, r) : TensorView();
      ZR_RETURN_IF_ERROR(
          SgdStep(h, f32(master_, r), f32(grad_shard_, r), momentum, out, resources_.compute));
    } else {
      const AdamHyper h{.lr = args.lr,
                        .beta1 = opt.beta1,
                        .beta2 = opt.beta2,
                        .eps = opt.eps,
                        .weight_decay = wd,
                        .decoupled = opt.kind == OptimizerKind::kAdamW,
                        .step = args.step,
                        .grad_scale = args.grad_scale};
      ZR_RETURN_IF_ERROR(AdamStep(h, f32(master_, r), f32(grad_shard_, r), f32(exp_avg_, r),
                                  f32(exp_avg_sq_, r), out, resources_.compute));
    }
  }
  return absl::OkStatus();
}

Status ShardedUnit::AfterStep() {
  const ShardManagerOptions& o = options();
  Stream* compute = resources_.compute;
  ZR_RETURN_IF_ERROR(FillZero(grad_shard_.data(), device(), grad_shard_.bytes(), compute));
  const int64_t shard = layout_.shard_numel();
  if (o.stage == ZeroStage::k1 || o.stage == ZeroStage::k2) {
    void* own =
        static_cast<char*>(compute_full_.data()) + rank_ * shard * DTypeSize(o.compute_dtype);
    resources_.dp->SetTraceLabel(StrCat("all-gather updated ", name_));
    ZR_RETURN_IF_ERROR(
        resources_.dp->AllGather(own, compute_full_.data(), shard, o.compute_dtype, compute));
    resources_.dp->SetTraceLabel("");
  } else if (o.stage == ZeroStage::k3) {
    if (!persistent_) {
      ZR_CHECK(state_ == ShardState::kSharded)
          << "optimizer step while unit '" << name_ << "' is " << ShardStateName(state_);
      return absl::OkStatus();
    }
    ZR_RETURN_IF_ERROR(resources_.dp->AllGather(compute_shard_.data(), gathered_.data(), shard,
                                                o.compute_dtype, compute));
  }
  return absl::OkStatus();
}

Status ShardedUnit::GatherMaster(int i, std::span<float> out) {
  const ParamSpec& spec = layout_.params().at(i);
  if (static_cast<int64_t>(out.size()) != spec.numel()) {
    return absl::InvalidArgumentError(StrCat("GatherMaster of '", spec.name, "' into ", out.size(),
                                             " elements, expected ", spec.numel()));
  }
  // Gathered on the device and the compute stream (any backend, NCCL included), then copied.
  // Stage 0 does not shard: every rank holds the whole master already.
  const int64_t shard = layout_.shard_numel();
  Stream* compute = resources_.compute;
  std::vector<float> full(static_cast<size_t>(layout_.padded_numel()));
  Buffer gathered;
  const void* source = master_.data();
  if (layout_.dp_size() > 1) {
    ZR_RETURN_IF_ERROR(Allocate(&gathered, full.size() * 4, MemoryCategory::kWorkspace, compute));
    ZR_RETURN_IF_ERROR(
        resources_.dp->AllGather(master_.data(), gathered.data(), shard, DType::kF32, compute));
    source = gathered.data();
  }
  ZR_RETURN_IF_ERROR(
      CopyBytes(full.data(), Device::Cpu(), source, device(), full.size() * 4, compute));
  ZR_RETURN_IF_ERROR(compute->Synchronize());
  const Range flat = layout_.flat_range(i);
  std::copy(full.begin() + flat.begin, full.begin() + flat.end, out.begin());
  return absl::OkStatus();
}

bool ShardedUnit::HasState(StateBuffer kind) const {
  switch (kind) {
    case StateBuffer::kMaster:
      return static_cast<bool>(master_);
    case StateBuffer::kExpAvg:
      return static_cast<bool>(exp_avg_);
    case StateBuffer::kExpAvgSq:
      return static_cast<bool>(exp_avg_sq_);
  }
  return false;
}

StatusOr<std::vector<float>> ShardedUnit::ReadState(StateBuffer kind) const {
  if (!HasState(kind)) {
    return absl::FailedPreconditionError(StrCat("unit '", name_, "' keeps no such state"));
  }
  const Buffer& b = kind == StateBuffer::kMaster   ? master_
                    : kind == StateBuffer::kExpAvg ? exp_avg_
                                                   : exp_avg_sq_;
  std::vector<float> out(static_cast<size_t>(layout_.shard_numel()));
  ZR_RETURN_IF_ERROR(CopyBytes(out.data(), Device::Cpu(), b.data(), b.device(), out.size() * 4,
                               resources_.compute));
  ZR_RETURN_IF_ERROR(resources_.compute->Synchronize());
  return out;
}

Status ShardedUnit::WriteState(StateBuffer kind, std::span<const float> values) {
  if (!HasState(kind)) {
    return absl::FailedPreconditionError(StrCat("unit '", name_, "' keeps no such state"));
  }
  const int64_t shard = layout_.shard_numel();
  if (static_cast<int64_t>(values.size()) != shard) {
    return absl::InvalidArgumentError(StrCat("WriteState of unit '", name_, "': ", values.size(),
                                             " values for a shard of ", shard));
  }
  ZR_CHECK(state_ == ShardState::kSharded || persistent_)
      << "WriteState while unit '" << name_ << "' is " << ShardStateName(state_);
  Stream* compute = resources_.compute;
  Buffer& b = kind == StateBuffer::kMaster   ? master_
              : kind == StateBuffer::kExpAvg ? exp_avg_
                                             : exp_avg_sq_;
  ZR_RETURN_IF_ERROR(
      CopyBytes(b.data(), b.device(), values.data(), Device::Cpu(), values.size() * 4, compute));
  if (kind != StateBuffer::kMaster) return compute->Synchronize();
  const ShardManagerOptions& o = options();
  if (o.stage == ZeroStage::k3) {
    ZR_RETURN_IF_ERROR(Cast(MasterShard(),
                            TensorView(compute_shard_.data(), o.compute_dtype, {shard}, device()),
                            compute));
  } else if (compute_full_) {
    ZR_RETURN_IF_ERROR(Cast(MasterShard(), ComputeFlat().Flat(rank_ * shard, shard), compute));
  }
  // Gradients zeroed, compute copies all-gathered as after an optimizer step.
  ZR_RETURN_IF_ERROR(AfterStep());
  return compute->Synchronize();
}

}  // namespace zerort
