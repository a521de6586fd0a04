// ShardedOptimizer's 1-bit optimizers: DeepSpeed's 1-bit Adam, 0/1 Adam and 1-bit LAMB over
// the units' in-memory state ([Note: 1-bit Adam], [Note: 0/1 Adam], [Note: 1-bit LAMB] in
// sharding/compressed_allreduce.h).
#include <algorithm>
#include <cmath>

#include "zerort/kernels/lamb.h"
#include "zerort/kernels/onebit.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/optimizer_state.h"
#include "zerort/sharding/sharded_optimizer.h"

namespace zerort {

Status ShardedOptimizer::ZeroErrors(bool accumulators) {
  for (PlacedBuffer* b : {&fused_, &fused_worker_error_, &fused_server_error_}) {
    if (!*b) continue;
    const TensorView v = b->View();
    ZR_RETURN_IF_ERROR(FillZero(v.data(), v.device(), v.nbytes(), StreamFor(b->tier())));
  }
  for (auto& s : units_) {
    for (PlacedBuffer* b : {&s->worker_error, &s->server_error, &s->accumulator}) {
      if (!*b || (b == &s->accumulator && !accumulators)) continue;
      const TensorView v = b->View();
      ZR_RETURN_IF_ERROR(FillZero(v.data(), v.device(), v.nbytes(), StreamFor(b->tier())));
    }
  }
  return absl::OkStatus();
}

Status ShardedOptimizer::ResetCompressionErrors() {
  lrs_ = 0;
  return ZeroErrors(true);
}

void ShardedOptimizer::RestoreSchedule(int64_t steps) {
  if (zero_one_) zero_one_->Restore(steps);
}

bool ShardedOptimizer::ReducesGradients(int64_t step) {
  const OptimizerOptions& opt = resources_.options->optimizer;
  if (opt.kind == OptimizerKind::kOneBitAdam || opt.kind == OptimizerKind::kOneBitLamb) {
    return !OneBitCompressing(opt, step);
  }
  if (!zero_one_) return true;
  ZR_CHECK(zero_one_->steps() == step - 1)
      << "0/1 Adam's schedule is at step " << zero_one_->steps() << ", asked about " << step;
  return zero_one_->Next().reduce;
}

Status ShardedOptimizer::EachPiece(int u, const OptimizerStepArgs& args, OneBitPhase phase,
                                   float grad_scale, const TensorView& out) {
  UnitState& s = *units_[u];
  const OptimizerOptions& opt = resources_.options->optimizer;
  const FlatLayout& layout = s.unit->layout();
  const TensorView master = s.master.View(), grad = GradView(u), m = s.exp_avg.View(),
                   v = s.exp_avg_sq.View();
  for (const ShardPiece& piece : layout.ShardPieces(s.unit->layout_rank())) {
    const int64_t at = piece.shard_range.begin, n = piece.shard_range.size();
    const OneBitAdamHyper h{
        .lr = args.lr,
        .beta1 = opt.beta1,
        .beta2 = opt.beta2,
        .eps = opt.eps,
        .weight_decay = layout.params()[piece.param].weight_decay ? opt.weight_decay : 0.0f,
        .grad_scale = grad_scale};
    ZR_RETURN_IF_ERROR(OneBitAdamStep(h, phase, master.Flat(at, n), grad.Flat(at, n), m.Flat(at, n),
                                      v.Flat(at, n), out.data() ? out.Flat(at, n) : TensorView(),
                                      StreamFor(tier(u))));
  }
  return absl::OkStatus();
}

Status ShardedOptimizer::CompressedMean(int u, const TensorView& values, const char* what) {
  UnitState& s = *units_[u];
  if (!s.worker_error) return absl::OkStatus();  // one data-parallel rank
  if (!onebit_)
    onebit_ = std::make_unique<OneBitAllReduce>(*resources_.dp, *resources_.tiers.device);
  resources_.dp->recorder().SetLabel(StrCat("1-bit ", what, " of ", s.unit->name()));
  Status status = onebit_->Run(OneBitSegments(s.unit->layout()), values, s.worker_error.View(),
                               s.server_error.View(), StreamFor(tier(u)));
  resources_.dp->recorder().SetLabel("");
  return status;
}

Status ShardedOptimizer::UpdateOneBit(int u, const OptimizerStepArgs& args, const TensorView& out) {
  if (args.step == 1) return absl::OkStatus();  // DeepSpeed's initialisation step
  if (!OneBitCompressing(resources_.options->optimizer, args.step)) {
    return EachPiece(u, args, OneBitPhase::kWarmup, args.grad_scale, out);
  }
  ZR_RETURN_IF_ERROR(EachPiece(u, args, OneBitPhase::kMomentum, args.grad_scale, out));
  ZR_RETURN_IF_ERROR(CompressedMean(u, units_[u]->exp_avg.View(), "momentum"));
  return EachPiece(u, args, OneBitPhase::kApply, args.grad_scale, out);
}

Status ShardedOptimizer::UpdateZeroOne(int u, const OptimizerStepArgs& args,
                                       const ZeroOneStep& plan, const TensorView& out) {
  if (plan.init) return absl::OkStatus();  // DeepSpeed's initialisation step
  UnitState& s = *units_[u];
  Stream* stream = StreamFor(tier(u));
  if (!plan.frozen) {
    if (plan.variance) return EachPiece(u, args, OneBitPhase::kWarmup, args.grad_scale, out);
    // The gradient itself through the compressed all-reduce; the momentum from it. With one rank
    // DeepSpeed leaves the momentum as it is on these steps.
    if (s.worker_error) {
      const TensorView g = GradView(u);
      ZR_RETURN_IF_ERROR(Scale(g, args.grad_scale, stream));
      ZR_RETURN_IF_ERROR(CompressedMean(u, g, "gradient"));
      ZR_RETURN_IF_ERROR(EachPiece(u, args, OneBitPhase::kMomentum, 1.0f, out));
    }
    return EachPiece(u, args, OneBitPhase::kApply, args.grad_scale, out);
  }
  // A local step from this rank's gradient, summed into the accumulator.
  ZR_RETURN_IF_ERROR(EachPiece(u, args, OneBitPhase::kMomentum, args.grad_scale, out));
  const OptimizerOptions& opt = resources_.options->optimizer;
  const FlatLayout& layout = s.unit->layout();
  const TensorView master = s.master.View(), m = s.exp_avg.View(), v = s.exp_avg_sq.View(),
                   acc = s.accumulator.View();
  auto each = [&](ZeroOnePhase phase) -> Status {
    for (const ShardPiece& piece : layout.ShardPieces(s.unit->layout_rank())) {
      const int64_t at = piece.shard_range.begin, n = piece.shard_range.size();
      const OneBitAdamHyper h{
          .lr = args.lr,
          .eps = opt.eps,
          .weight_decay = layout.params()[piece.param].weight_decay ? opt.weight_decay : 0.0f};
      ZR_RETURN_IF_ERROR(ZeroOneAdamStep(h, static_cast<float>(lrs_), phase, master.Flat(at, n),
                                         m.Flat(at, n), v.Flat(at, n), acc.Flat(at, n),
                                         out.data() ? out.Flat(at, n) : TensorView(), stream));
    }
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(each(ZeroOnePhase::kLocalStep));
  if (!plan.sync) return absl::OkStatus();
  ZR_RETURN_IF_ERROR(each(ZeroOnePhase::kSyncOut));
  ZR_RETURN_IF_ERROR(CompressedMean(u, acc, "accumulated steps"));
  return each(ZeroOnePhase::kSyncIn);
}

// ------------------------------------------------------------------ 1-bit LAMB

std::span<OneBitLambParam> ShardedOptimizer::LambParams(int u) { return units_.at(u)->lamb; }

StatusOr<::zerort::Buffer> ShardedOptimizer::DeviceWorkspace(int64_t n, Stream* stream) {
  Allocator* alloc = resources_.tiers.device;
  ZR_ASSIGN_OR_RETURN(::zerort::Buffer b,
                      alloc->Allocate(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4,
                                      MemoryCategory::kWorkspace, stream));
  ZR_RETURN_IF_ERROR(FillZero(b.data(), alloc->device(), static_cast<size_t>(n) * 4, stream));
  return b;
}

Status ShardedOptimizer::SetLambScaling() {
  Stream* stream = StreamFor(placement());
  int64_t pieces = 0;
  for (const auto& s : units_) {
    pieces += static_cast<int64_t>(s->unit->layout().ShardPieces(s->unit->layout_rank()).size());
  }
  ZR_ASSIGN_OR_RETURN(::zerort::Buffer sums, DeviceWorkspace(pieces, stream));
  const Device device = resources_.tiers.device->device();
  int64_t k = 0;
  for (const auto& s : units_) {
    const TensorView m = s->exp_avg.View();
    for (const ShardPiece& piece : s->unit->layout().ShardPieces(s->unit->layout_rank())) {
      const TensorView out(sums.as<float>() + k++, DType::kF32, {1}, device);
      ZR_RETURN_IF_ERROR(
          SumOfSquares(m.Flat(piece.shard_range.begin, piece.shard_range.size()), out, stream));
    }
  }
  std::vector<float> host(static_cast<size_t>(pieces));
  ZR_RETURN_IF_ERROR(CopyBytes(host.data(), Device::Cpu(), sums.data(), device,
                               host.size() * sizeof(float), stream));
  if (stream != nullptr) ZR_RETURN_IF_ERROR(stream->Synchronize());
  // DeepSpeed: scale = ||m|| / sqrt(n) per parameter, their mean over the rank's parameters, and
  // scaling = mean / scale (a zero momentum, where DeepSpeed divides by zero, gets 1).
  std::vector<double> scale(host.size());
  double united = 0;
  k = 0;
  for (const auto& s : units_) {
    for (const ShardPiece& piece : s->unit->layout().ShardPieces(s->unit->layout_rank())) {
      scale[static_cast<size_t>(k)] = std::sqrt(static_cast<double>(host[static_cast<size_t>(k)])) /
                                      std::sqrt(static_cast<double>(piece.shard_range.size()));
      united += scale[static_cast<size_t>(k++)];
    }
  }
  united /= static_cast<double>(std::max<int64_t>(pieces, 1));
  k = 0;
  for (auto& s : units_) {
    for (const ShardPiece& piece : s->unit->layout().ShardPieces(s->unit->layout_rank())) {
      const double own = scale[static_cast<size_t>(k++)];
      s->lamb[static_cast<size_t>(piece.param)].scaling =
          own > 0 ? static_cast<float>(united / own) : 1.0f;
    }
  }
  return absl::OkStatus();
}

Status ShardedOptimizer::CompressLambMomentum(const OptimizerStepArgs& args) {
  const OptimizerOptions& opt = resources_.options->optimizer;
  ZR_CHECK(fused_) << "1-bit LAMB's fused momentum is allocated by Finalize";
  // DeepSpeed sets the scaling coefficients when the first parameter has none.
  if (!units_.empty() && !units_[0]->lamb.empty() && !(units_[0]->lamb[0].scaling > 0.0f)) {
    ZR_RETURN_IF_ERROR(SetLambScaling());
  }
  Stream* stream = StreamFor(placement());
  const TensorView fused = fused_.View();
  const OneBitAdamHyper h{.beta1 = opt.beta1, .grad_scale = args.grad_scale};
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    UnitState& s = *units_[u];
    const TensorView g = GradView(u), m = s.exp_avg.View();
    int64_t at = fused_at_[static_cast<size_t>(u)];
    for (const ShardPiece& piece : s.unit->layout().ShardPieces(s.unit->layout_rank())) {
      const int64_t from = piece.shard_range.begin, n = piece.shard_range.size();
      ZR_RETURN_IF_ERROR(OneBitLambMomentum(h, s.lamb[static_cast<size_t>(piece.param)].scaling,
                                            g.Flat(from, n), m.Flat(from, n), fused.Flat(at, n),
                                            stream));
      at += n;
    }
  }
  if (!fused_worker_error_) return absl::OkStatus();  // one data-parallel rank
  if (!onebit_) {
    onebit_ = std::make_unique<OneBitAllReduce>(*resources_.dp, *resources_.tiers.device);
  }
  // The whole padded buffer as one segment: its padding goes through the mean as DeepSpeed's.
  const OneBitAllReduce::Segment whole{0, fused.numel()};
  resources_.dp->recorder().SetLabel("1-bit LAMB momentum");
  Status status = onebit_->Run(std::span(&whole, 1), fused, fused_worker_error_.View(),
                               fused_server_error_.View(), stream);
  resources_.dp->recorder().SetLabel("");
  return status;
}

Status ShardedOptimizer::UpdateOneBitLamb(int u, const OptimizerStepArgs& args,
                                          const TensorView& out) {
  if (args.step == 1) return absl::OkStatus();  // DeepSpeed's initialisation step
  UnitState& s = *units_[u];
  const OptimizerOptions& opt = resources_.options->optimizer;
  Stream* stream = StreamFor(tier(u));
  const TensorView master = s.master.View(), grad = GradView(u), m = s.exp_avg.View(),
                   v = s.exp_avg_sq.View(), fresh = s.exp_avg_sq_fresh.View();
  if (!OneBitCompressing(opt, args.step)) {
    ZR_RETURN_IF_ERROR(UpdateLamb(u, args, master, grad, m, v, out, s.lamb));
    if (args.step != opt.freeze_step) return absl::OkStatus();
    return CopyBytes(fresh.data(), fresh.device(), v.data(), v.device(), v.nbytes(), stream);
  }
  const FlatLayout& layout = s.unit->layout();
  const std::vector<ShardPiece> pieces = layout.ShardPieces(s.unit->layout_rank());
  const int64_t np = static_cast<int64_t>(pieces.size());
  ZR_ASSIGN_OR_RETURN(::zerort::Buffer stats, DeviceWorkspace(3 * np, stream));
  const Device device = resources_.tiers.device->device();
  const TensorView fused = fused_.View();
  auto wd = [&](int param) {
    return layout.params()[param].weight_decay ? opt.weight_decay : 0.0f;
  };
  int64_t at = fused_at_[static_cast<size_t>(u)];
  for (int64_t i = 0; i < np; ++i) {
    const ShardPiece& piece = pieces[static_cast<size_t>(i)];
    const int64_t from = piece.shard_range.begin, n = piece.shard_range.size();
    const OneBitAdamHyper h{
        .beta1 = opt.beta1, .beta2 = opt.beta2, .eps = opt.eps, .weight_decay = wd(piece.param)};
    ZR_RETURN_IF_ERROR(OneBitLambReconstruct(
        h, s.lamb[static_cast<size_t>(piece.param)].scaling, master.Flat(from, n),
        fused.Flat(at, n), m.Flat(from, n), v.Flat(from, n), fresh.Flat(from, n),
        grad.Flat(from, n), TensorView(stats.as<float>() + 3 * i, DType::kF32, {3}, device),
        stream));
    at += n;
  }
  std::vector<float> host(static_cast<size_t>(3 * np));
  ZR_RETURN_IF_ERROR(CopyBytes(host.data(), Device::Cpu(), stats.data(), device,
                               host.size() * sizeof(float), stream));
  if (stream != nullptr) ZR_RETURN_IF_ERROR(stream->Synchronize());
  for (int64_t i = 0; i < np; ++i) {
    const ShardPiece& piece = pieces[static_cast<size_t>(i)];
    const float* st = host.data() + 3 * i;
    OneBitLambParam& c = s.lamb[static_cast<size_t>(piece.param)];
    double factor = st[2];
    if (wd(piece.param) > 0.0f) {
      const double update_norm = std::sqrt(static_cast<double>(st[1]));
      const double q = update_norm > 0
                           ? std::min(1.0, std::sqrt(static_cast<double>(st[0])) / update_norm)
                           : 1.0;
      factor = factor * q + (1.0 - q);
    }
    factor = std::clamp(factor, static_cast<double>(opt.factor_min),
                        static_cast<double>(opt.factor_max));
    const double last = c.last_factor, threshold = opt.factor_threshold;
    factor = std::min(factor, last * (1.0 + threshold));
    factor = std::max(factor, last * (1.0 - threshold));
    c.last_factor = static_cast<float>(factor);
    const LambHyper h{.lr = args.lr, .bias_correction = false};
    const int64_t from = piece.shard_range.begin, n = piece.shard_range.size();
    ZR_RETURN_IF_ERROR(LambApply(h, static_cast<float>(c.coeff_freeze * factor),
                                 master.Flat(from, n), grad.Flat(from, n),
                                 out.data() ? out.Flat(from, n) : TensorView(), stream));
  }
  return absl::OkStatus();
}

}  // namespace zerort
