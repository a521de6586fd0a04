// GradientReducer: runs the reduce plan's buckets ([Note: the reduce plan], reduce_plan.h).
#include "zerort/sharding/gradient_reducer.h"

#include <algorithm>

#include "zerort/kernels/reduce.h"
#include "zerort/runtime/strings.h"

namespace zerort {

GradientReducer::GradientReducer(const UnitResources& resources, ShardedOptimizer* optimizer)
    : resources_(resources),
      optimizer_(optimizer),
      pending_(resources.options->reduce_bucket_size) {
  // Without overlap_comm the reductions run on the compute stream itself, in program order.
  if (!resources_.options->overlap_comm) resources_.comm = resources_.compute;
  event_ = *CreateEvent(resources_.tiers.device->device());
  if (resources_.grad_intra != nullptr) {
    quantized_ = std::make_unique<QuantizedReduceScatter>(
        *resources_.dp, *resources_.grad_intra, resources_.grad_inter, *resources_.tiers.device,
        *resources_.compute);
  }
}

// DeepSpeed's gradient_predivide_factor f: divide by f before the reduction (a sum) and by
// (dp / f) after; f = 1 is a sum then the mean, which the collective's average does at once.
StatusOr<ReduceOp> GradientReducer::PreDivide(const std::vector<ShardedUnit*>& units,
                                              Stream* stream) const {
  const double f = resources_.options->gradient_predivide_factor;
  if (f == 1.0) return ReduceOp::kAvg;
  for (ShardedUnit* u : units) {
    ZR_RETURN_IF_ERROR(Scale(u->grad().Full(), static_cast<float>(1.0 / f), stream));
  }
  return ReduceOp::kSum;
}

Status GradientReducer::PostDivide(const TensorView& reduced, Stream* stream) const {
  const double f = resources_.options->gradient_predivide_factor;
  if (f == 1.0) return absl::OkStatus();
  return Scale(reduced, static_cast<float>(f / DataRanks()), stream);
}

int GradientReducer::DataRanks() const {
  return resources_.dp->size() * (resources_.replicate ? resources_.replicate->size() : 1);
}

// [Note: hybrid sharding]: what the shard group reduced, summed (or averaged) over the replicas.
Status GradientReducer::AcrossReplicas(void* data, int64_t count, ReduceOp op,
                                       const std::string& what) {
  Communicator* replicate = resources_.replicate;
  if (replicate == nullptr) return absl::OkStatus();
  replicate->recorder().SetLabel(StrCat("all-reduce across replicas ", what));
  ZR_RETURN_IF_ERROR(replicate->AllReduce(data, data, static_cast<size_t>(count),
                                          resources_.options->reduce_dtype, op, resources_.comm));
  replicate->recorder().SetLabel("");
  ++collectives_;
  return absl::OkStatus();
}

Status GradientReducer::CommAfterCompute() {
  ZR_RETURN_IF_ERROR(event_->Record(*resources_.compute));
  return resources_.comm->WaitEvent(*event_);
}

std::vector<ReduceSizes> GradientReducer::Sizes(const std::vector<ShardedUnit*>& units) {
  std::vector<ReduceSizes> sizes;
  for (const ShardedUnit* u : units) {
    sizes.push_back({u->layout().padded_numel(), u->layout().shard_numel()});
  }
  return sizes;
}

ReduceGroups GradientReducer::Groups() const {
  return {resources_.dp->size(), resources_.replicate ? resources_.replicate->size() : 1};
}

Status GradientReducer::Add(ShardedUnit& unit) {
  // Another micro-batch of a unit already waiting: its gradient accumulated in place.
  if (pending_.Add(&unit, unit.layout().padded_numel())) return Flush();
  return absl::OkStatus();
}

// [Note: the reduce plan]: kAddShards, kReduceScatter, kQuantized or kAllReduce.
Status GradientReducer::Flush() {
  const std::vector<ShardedUnit*> units = pending_.Take();
  const ShardManagerOptions& o = *resources_.options;
  const ReducePlan plan =
      PlanReduceScatter(Sizes(units), Groups(), o.reduce_scatter, quantized_ != nullptr);
  if (plan.path == ReducePlan::Path::kNone) return absl::OkStatus();
  const DType dtype = o.reduce_dtype;
  const size_t elem = DTypeSize(dtype);
  const Device device = resources_.tiers.device->device();
  const int ranks = resources_.dp->size();
  Stream* comm = resources_.comm;
  ZR_RETURN_IF_ERROR(CommAfterCompute());
  if (plan.path == ReducePlan::Path::kAddShards) {
    // Each full gradient is its own shard, added straight into it (after the replicas'
    // reduction, with hybrid sharding).
    for (ShardedUnit* u : units) {
      if (plan.replica_count > 0) {
        ZR_ASSIGN_OR_RETURN(const ReduceOp op, PreDivide({u}, comm));
        const TensorView g = u->grad().Full();
        ZR_RETURN_IF_ERROR(AcrossReplicas(g.data(), g.numel(), op, u->name()));
        ZR_RETURN_IF_ERROR(PostDivide(g, comm));
      }
      ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(
          *u, u->grad().Full().Flat(0, u->layout().shard_numel()), *comm));
      ZR_RETURN_IF_ERROR(u->grad().Drop(*comm));
    }
    return absl::OkStatus();
  }
  if (plan.path == ReducePlan::Path::kAllReduce) {
    // DeepSpeed's reduce_scatter false: the full gradients all-reduced, this rank's shard (the
    // full gradient is rank-major) kept.
    ZR_RETURN_IF_ERROR(AllReduce(units));
    const int64_t rank = resources_.dp->rank();
    for (ShardedUnit* u : units) {
      const int64_t s = u->layout().shard_numel();
      ZR_RETURN_IF_ERROR(
          optimizer_->AccumulateGradient(*u, u->grad().Full().Flat(rank * s, s), *comm));
      ZR_RETURN_IF_ERROR(u->grad().Drop(*comm));
    }
    return absl::OkStatus();
  }
  ZR_ASSIGN_OR_RETURN(const ReduceOp op, PreDivide(units, comm));  // before packing
  const int64_t bucket_shard = plan.shards;
  // A single unit is reduced straight from its full gradient, which is already rank-major.
  Buffer packed;
  if (plan.packed > 0) {
    ZR_ASSIGN_OR_RETURN(packed, resources_.tiers.device->Allocate(
                                    plan.packed * elem, MemoryCategory::kCommBuffers, comm));
    for (int r = 0; r < ranks; ++r) {
      int64_t offset = 0;
      for (ShardedUnit* u : units) {
        const int64_t s = u->layout().shard_numel();
        ZR_RETURN_IF_ERROR(
            CopyBytes(packed.as<char>() + (r * bucket_shard + offset) * elem, device,
                      static_cast<const char*>(u->grad().Full().data()) + r * s * elem, device,
                      s * elem, comm));
        offset += s;
      }
    }
  }
  ZR_ASSIGN_OR_RETURN(Buffer reduced, resources_.tiers.device->Allocate(
                                          plan.reduced * elem, MemoryCategory::kCommBuffers, comm));
  const bool single = units.size() == 1;
  const std::string what = single ? units[0]->name() : StrCat("bucket of ", units.size(), " units");
  resources_.dp->recorder().SetLabel(StrCat("reduce-scatter ", what));
  const void* full = single ? units[0]->grad().Full().data() : packed.data();
  if (plan.path == ReducePlan::Path::kQuantized) {
    ZR_RETURN_IF_ERROR(quantized_->Run(static_cast<const float*>(full), reduced.as<float>(),
                                       bucket_shard, op, comm));
  } else {
    ZR_RETURN_IF_ERROR(
        resources_.dp->ReduceScatter(full, reduced.data(), plan.group_count, dtype, op, comm));
  }
  resources_.dp->recorder().SetLabel("");
  ++collectives_;
  if (plan.replica_count > 0) {
    ZR_RETURN_IF_ERROR(AcrossReplicas(reduced.data(), plan.replica_count, op, what));
  }
  const TensorView all(reduced.data(), dtype, {bucket_shard}, device);
  ZR_RETURN_IF_ERROR(PostDivide(all, comm));
  int64_t offset = 0;
  for (ShardedUnit* u : units) {
    const int64_t s = u->layout().shard_numel();
    ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(*u, all.Flat(offset, s), *comm));
    ZR_RETURN_IF_ERROR(u->grad().Drop(*comm));
    offset += s;
  }
  return absl::OkStatus();
}

Status GradientReducer::AllReduce(const std::vector<ShardedUnit*>& bucket) {
  // One data rank: the mean over ranks is the gradient itself (no copy through the communicator).
  const ReducePlan plan = PlanAllReduce(Sizes(bucket), Groups());
  if (plan.path == ReducePlan::Path::kNone) return absl::OkStatus();
  const DType dtype = resources_.options->reduce_dtype;
  const size_t elem = DTypeSize(dtype);
  const Device device = resources_.tiers.device->device();
  Stream* comm = resources_.comm;
  ZR_ASSIGN_OR_RETURN(const ReduceOp op, PreDivide(bucket, comm));
  const std::string what =
      bucket.size() == 1 ? bucket[0]->name() : StrCat("bucket of ", bucket.size(), " units");
  // Over the shard group; then, with hybrid sharding (stage 1: stage 0 has no replicas), only
  // this rank's shard of each unit across the replicas: the part its optimizer reads, 1/S of the
  // gradient ([Note: hybrid sharding]).
  auto in_group = [&](void* data) -> Status {
    if (plan.group_count == 0) return absl::OkStatus();
    resources_.dp->recorder().SetLabel(StrCat("all-reduce ", what));
    ZR_RETURN_IF_ERROR(resources_.dp->AllReduce(data, data, plan.group_count, dtype, op, comm));
    resources_.dp->recorder().SetLabel("");
    ++collectives_;
    return absl::OkStatus();
  };
  auto across = [&](void* data) -> Status {
    if (plan.replica_count == 0) return absl::OkStatus();
    return AcrossReplicas(data, plan.replica_count, op, what);
  };
  // Where this rank's shard starts in a unit's flat gradient.
  auto own = [](const ShardedUnit* u) { return u->layout_rank() * u->layout().shard_numel(); };
  if (plan.packed == 0) {  // one unit, in place
    const TensorView g = bucket[0]->grad().Full();
    ZR_RETURN_IF_ERROR(in_group(g.data()));
    ZR_RETURN_IF_ERROR(across(static_cast<char*>(g.data()) + own(bucket[0]) * elem));
    return PostDivide(g, comm);
  }
  ZR_ASSIGN_OR_RETURN(Buffer packed, resources_.tiers.device->Allocate(
                                         plan.packed * elem, MemoryCategory::kCommBuffers, comm));
  // Every unit's full gradient into `packed` (in) or back out of it; with `shard`, only this
  // rank's shard of each, between `packed` and the consecutive shards at `shard`.
  auto move = [&](bool in, char* shard) -> Status {
    int64_t offset = 0, at = 0;
    for (ShardedUnit* u : bucket) {
      const TensorView g = u->grad().Full();
      const int64_t n = shard != nullptr ? u->layout().shard_numel() : g.numel();
      char* a = packed.as<char>() + (offset + (shard != nullptr ? own(u) : 0)) * elem;
      char* b = shard != nullptr ? shard + at * elem : static_cast<char*>(g.data());
      ZR_RETURN_IF_ERROR(in ? CopyBytes(a, device, b, device, n * elem, comm)
                            : CopyBytes(b, device, a, device, n * elem, comm));
      offset += g.numel();
      at += n;
    }
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(move(true, nullptr));
  ZR_RETURN_IF_ERROR(in_group(packed.data()));
  if (plan.replica_shards > 0) {
    ZR_ASSIGN_OR_RETURN(Buffer own_shards,
                        resources_.tiers.device->Allocate(plan.replica_shards * elem,
                                                          MemoryCategory::kCommBuffers, comm));
    ZR_RETURN_IF_ERROR(move(false, own_shards.as<char>()));  // packed -> own_shards
    ZR_RETURN_IF_ERROR(across(own_shards.data()));
    ZR_RETURN_IF_ERROR(move(true, own_shards.as<char>()));  // own_shards -> packed
  }
  ZR_RETURN_IF_ERROR(PostDivide(TensorView(packed.data(), dtype, {plan.total}, device), comm));
  return move(false, nullptr);
}

Status GradientReducer::Finish(std::vector<std::unique_ptr<ShardedUnit>>& units, bool reduce) {
  const ShardManagerOptions& o = *resources_.options;
  if (o.stage == ZeroStage::k2 || o.stage == ZeroStage::k3) {
    ZR_RETURN_IF_ERROR(Flush());
  } else if (reduce) {
    ZR_RETURN_IF_ERROR(CommAfterCompute());
    ReduceBucket<ShardedUnit*> bucket(o.reduce_bucket_size);
    for (auto& u : units) {
      if (bucket.Add(u.get(), u->layout().padded_numel())) {
        ZR_RETURN_IF_ERROR(AllReduce(bucket.Take()));
      }
    }
    ZR_RETURN_IF_ERROR(AllReduce(bucket.Take()));
  }
  // The optimizer, on the compute stream, reads what the comm stream produced.
  ZR_RETURN_IF_ERROR(event_->Record(*resources_.comm));
  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*event_));
  if (o.stage == ZeroStage::k0 || o.stage == ZeroStage::k1) {
    // This rank's slice of the all-reduced gradient becomes its gradient shard.
    for (auto& u : units) {
      const int64_t shard = u->layout().shard_numel();
      ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(
          *u, u->grad().Full().Flat(u->layout_rank() * shard, shard), *resources_.compute));
      ZR_RETURN_IF_ERROR(u->grad().Zero());
    }
  }
  // The host tiers' gradients in flight, added: the step reads them next.
  return optimizer_->FinishHostGradients();
}

}  // namespace zerort
