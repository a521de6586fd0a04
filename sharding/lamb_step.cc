// ShardedOptimizer's LAMB over a unit's in-memory shard: the moments and each parameter piece's
// update with its sums, the sums over the data-parallel and tensor-parallel groups, then each
// parameter's trust ratio ([Note: LAMB with tensor parallelism]).
#include <vector>

#include "zerort/kernels/lamb.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/optimizer_state.h"

namespace zerort {

Status ShardedOptimizer::UpdateLamb(int u, const OptimizerStepArgs& args, const TensorView& master,
                                    const TensorView& grad, const TensorView& exp_avg,
                                    const TensorView& exp_avg_sq, const TensorView& out,
                                    std::span<OneBitLambParam> onebit) {
  const OptimizerOptions& opt = resources_.options->optimizer;
  const FlatLayout& layout = units_[u]->unit->layout();
  const Device device = master.device();
  Stream* stream = StreamFor(tier(u));
  const int64_t params = static_cast<int64_t>(layout.params().size());
  Allocator* alloc = device.is_cpu() && !resources_.tiers.device->device().is_cpu()
                         ? resources_.tiers.host
                         : resources_.tiers.device;
  ZR_ASSIGN_OR_RETURN(
      ::zerort::Buffer sums_buffer,
      alloc->Allocate(2 * params * sizeof(float), MemoryCategory::kWorkspace, stream));
  const TensorView sums(sums_buffer.data(), DType::kF32, {2 * params}, device);
  ZR_RETURN_IF_ERROR(FillZero(sums.data(), device, sums.nbytes(), stream));
  auto hyper = [&](int param) {
    return LambHyper{.lr = args.lr,
                     .beta1 = opt.beta1,
                     .beta2 = opt.beta2,
                     .eps = opt.eps,
                     .weight_decay = layout.params()[param].weight_decay ? opt.weight_decay : 0.0f,
                     .step = args.step,
                     .grad_scale = args.grad_scale,
                     .bias_correction = opt.bias_correction && opt.kind == OptimizerKind::kLamb,
                     .max_coeff = opt.max_coeff,
                     .min_coeff = opt.min_coeff};
  };
  const std::vector<ShardPiece> pieces = layout.ShardPieces(units_[u]->unit->layout_rank());
  auto part = [](const TensorView& v, const ShardPiece& p) {
    return v.data() ? v.Flat(p.shard_range.begin, p.shard_range.size()) : TensorView();
  };
  for (const ShardPiece& p : pieces) {
    ZR_RETURN_IF_ERROR(LambMoments(hyper(p.param), part(master, p), part(grad, p), part(exp_avg, p),
                                   part(exp_avg_sq, p), sums.Flat(2 * p.param, 2), stream));
  }
  // Every rank of the group joins, holding a piece of the parameter or not. Stage 0 holds the
  // whole unit on every rank: its sums are already the parameter's.
  Stream* comm_stream = stream != nullptr ? stream : resources_.compute;
  if (resources_.options->stage != ZeroStage::k0 && resources_.dp->size() > 1) {
    resources_.dp->recorder().SetLabel(StrCat("LAMB norms of ", units_[u]->unit->name()));
    if (stream == nullptr && !resources_.dp->moves_host_memory()) {
      // Host-tier sums and NCCL (device memory only): staged through the device, waited for.
      ZR_RETURN_IF_ERROR(AllReduceHostValues(
          *resources_.dp, *resources_.tiers.device, *resources_.compute, sums.data(),
          static_cast<size_t>(2 * params), DType::kF32, ReduceOp::kSum));
    } else {
      ZR_RETURN_IF_ERROR(resources_.dp->AllReduce(sums.data(), sums.data(), 2 * params, DType::kF32,
                                                  ReduceOp::kSum, comm_stream));
    }
    resources_.dp->recorder().SetLabel("");
  }
  std::vector<float> host(static_cast<size_t>(2 * params));
  // The host reads the sums next: host-tier sums are reduced on `comm_stream` (a queued one runs
  // the all-reduce later), device-tier ones are copied on `stream` after it.
  if (stream == nullptr) ZR_RETURN_IF_ERROR(comm_stream->Synchronize());
  ZR_RETURN_IF_ERROR(
      CopyBytes(host.data(), Device::Cpu(), sums.data(), device, sums.nbytes(), stream));
  if (stream != nullptr) ZR_RETURN_IF_ERROR(stream->Synchronize());
  // [Note: LAMB with tensor parallelism]
  // A parameter split over the tensor-parallel group (its frame's split_dim) has one norm, as
  // Megatron's LAMB takes it: the sums of p^2 and update^2 of each rank's part, summed over the
  // group after the data-parallel reduction has made them whole for this rank's part. A
  // replicated parameter (a norm's gain, a row-parallel bias) is the same on every rank of the
  // group, so it enters the sum on tensor-parallel rank 0 only (count_replicated, as in the
  // clipping norm): its sums stay its own, not tp times them (the ratio of two sums so scaled
  // would agree only to rounding). The sums are the unit's 2 x params floats, reduced in host
  // memory (staged through the device for NCCL, a few bytes the estimator leaves out), after the
  // data-parallel group's collective and in the same unit order on every rank, so the two groups'
  // collectives cannot cross. Not for NVMe state (refused) nor 1-bit LAMB (config_rules.cc refuses
  // it with tensor parallelism: its scaling coefficients average over each rank's own parts).
  if (Communicator* tp = resources_.tp; tp != nullptr && tp->size() > 1) {
    if (!resources_.count_replicated) {
      for (int64_t i = 0; i < params; ++i) {
        const GlobalFrame& f = layout.params()[static_cast<size_t>(i)].frame;
        if (f.split_dim < 0 || f.parts <= 1) host[2 * i] = host[2 * i + 1] = 0.0f;
      }
    }
    tp->recorder().SetLabel(StrCat("LAMB norms of ", units_[u]->unit->name()));
    Stream& on = *resources_.compute;
    const Status reduced =
        tp->moves_host_memory()
            ? tp->AllReduce(host.data(), host.data(), host.size(), DType::kF32, ReduceOp::kSum, &on)
            : AllReduceHostValues(*tp, *resources_.tiers.device, on, host.data(), host.size(),
                                  DType::kF32, ReduceOp::kSum);
    tp->recorder().SetLabel("");
    ZR_RETURN_IF_ERROR(reduced);
    ZR_RETURN_IF_ERROR(on.Synchronize());  // a queued stream reduces later
  }
  for (const ShardPiece& p : pieces) {
    const LambHyper h = hyper(p.param);
    const float coeff = LambCoefficient(h, host[2 * p.param], host[2 * p.param + 1]);
    if (!onebit.empty() && coeff != 1.0f) {  // [Note: 1-bit LAMB]: the frozen coefficient
      OneBitLambParam& c = onebit[static_cast<size_t>(p.param)];
      const double beta = opt.coeff_beta;
      c.coeff_freeze = static_cast<float>(beta * c.coeff_freeze + (1.0 - beta) * coeff);
    }
    ZR_RETURN_IF_ERROR(LambApply(h, coeff, part(master, p), part(grad, p), part(out, p), stream));
  }
  return absl::OkStatus();
}

}  // namespace zerort
