// GradientReducer: bucketed reduce-scatter (rank-major packing) and all-reduce.
#include "zerort/sharding/gradient_reducer.h"

#include <algorithm>

#include "zerort/kernels/reduce.h"
#include "zerort/runtime/strings.h"

namespace zerort {

GradientReducer::GradientReducer(const UnitResources& resources, ShardedOptimizer* optimizer)
    : resources_(resources), optimizer_(optimizer) {
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
    ZR_RETURN_IF_ERROR(Scale(u->FullGrad(), static_cast<float>(1.0 / f), stream));
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
  replicate->SetTraceLabel(StrCat("all-reduce across replicas ", what));
  ZR_RETURN_IF_ERROR(replicate->AllReduce(data, data, static_cast<size_t>(count),
                                          resources_.options->reduce_dtype, op, resources_.comm));
  replicate->SetTraceLabel("");
  ++collectives_;
  return absl::OkStatus();
}

Status GradientReducer::CommAfterCompute() {
  ZR_RETURN_IF_ERROR(event_->Record(*resources_.compute));
  return resources_.comm->WaitEvent(*event_);
}

Status GradientReducer::Add(ShardedUnit& unit) {
  const int64_t bucket = resources_.options->reduce_bucket_size;
  // Another micro-batch of a unit already waiting: its gradient accumulated in place.
  if (std::find(pending_.begin(), pending_.end(), &unit) != pending_.end()) return absl::OkStatus();
  pending_.push_back(&unit);
  pending_numel_ += unit.layout().padded_numel();
  if (pending_numel_ >= bucket) return FlushReduceScatter();
  return absl::OkStatus();
}

Status GradientReducer::FlushReduceScatter() {
  if (pending_.empty()) return absl::OkStatus();
  const ShardManagerOptions& o = *resources_.options;
  const DType dtype = o.reduce_dtype;
  const size_t elem = DTypeSize(dtype);
  const Device device = resources_.tiers.device->device();
  const int ranks = resources_.dp->size();
  Stream* comm = resources_.comm;
  ZR_RETURN_IF_ERROR(CommAfterCompute());
  if (ranks == 1) {
    // Nothing to reduce in the shard group: each full gradient is its own shard, added straight
    // into it (after the replicas' reduction, with hybrid sharding).
    for (ShardedUnit* u : pending_) {
      if (resources_.replicate != nullptr) {
        ZR_ASSIGN_OR_RETURN(const ReduceOp op, PreDivide({u}, comm));
        const TensorView g = u->FullGrad();
        ZR_RETURN_IF_ERROR(AcrossReplicas(g.data(), g.numel(), op, u->name()));
        ZR_RETURN_IF_ERROR(PostDivide(g, comm));
      }
      ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(
          *u, u->FullGrad().Flat(0, u->layout().shard_numel()), *comm));
      ZR_RETURN_IF_ERROR(u->DropFullGrad(*comm));
    }
    pending_.clear();
    pending_numel_ = 0;
    return absl::OkStatus();
  }
  if (!o.reduce_scatter) {
    // DeepSpeed's reduce_scatter false: the full gradients all-reduced, this rank's shard (the
    // full gradient is rank-major) kept.
    ZR_RETURN_IF_ERROR(AllReduceBucket(pending_));
    const int64_t rank = resources_.dp->rank();
    for (ShardedUnit* u : pending_) {
      const int64_t s = u->layout().shard_numel();
      ZR_RETURN_IF_ERROR(
          optimizer_->AccumulateGradient(*u, u->FullGrad().Flat(rank * s, s), *comm));
      ZR_RETURN_IF_ERROR(u->DropFullGrad(*comm));
    }
    pending_.clear();
    pending_numel_ = 0;
    return absl::OkStatus();
  }
  ZR_ASSIGN_OR_RETURN(const ReduceOp op, PreDivide(pending_, comm));  // before packing

  int64_t bucket_shard = 0;
  for (ShardedUnit* u : pending_) bucket_shard += u->layout().shard_numel();
  const bool single = pending_.size() == 1;
  // A single unit is reduced straight from its full gradient, which is already rank-major.
  Buffer packed;
  if (!single) {
    ZR_ASSIGN_OR_RETURN(packed,
                        resources_.tiers.device->Allocate(bucket_shard * ranks * elem,
                                                          MemoryCategory::kCommBuffers, comm));
    for (int r = 0; r < ranks; ++r) {
      int64_t offset = 0;
      for (ShardedUnit* u : pending_) {
        const int64_t s = u->layout().shard_numel();
        ZR_RETURN_IF_ERROR(CopyBytes(packed.as<char>() + (r * bucket_shard + offset) * elem, device,
                                     static_cast<const char*>(u->FullGrad().data()) + r * s * elem,
                                     device, s * elem, comm));
        offset += s;
      }
    }
  }
  ZR_ASSIGN_OR_RETURN(Buffer reduced, resources_.tiers.device->Allocate(
                                          bucket_shard * elem, MemoryCategory::kCommBuffers, comm));
  resources_.dp->SetTraceLabel(
      single ? StrCat("reduce-scatter ", pending_[0]->name())
             : StrCat("reduce-scatter bucket of ", pending_.size(), " units"));
  const void* full = single ? pending_[0]->FullGrad().data() : packed.data();
  if (quantized_) {
    ZR_RETURN_IF_ERROR(quantized_->Run(static_cast<const float*>(full), reduced.as<float>(),
                                       bucket_shard, op, comm));
  } else {
    ZR_RETURN_IF_ERROR(
        resources_.dp->ReduceScatter(full, reduced.data(), bucket_shard, dtype, op, comm));
  }
  resources_.dp->SetTraceLabel("");
  ++collectives_;
  ZR_RETURN_IF_ERROR(AcrossReplicas(
      reduced.data(), bucket_shard, op,
      single ? pending_[0]->name() : StrCat("bucket of ", pending_.size(), " units")));
  const TensorView all(reduced.data(), dtype, {bucket_shard}, device);
  ZR_RETURN_IF_ERROR(PostDivide(all, comm));
  int64_t offset = 0;
  for (ShardedUnit* u : pending_) {
    const int64_t s = u->layout().shard_numel();
    ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(*u, all.Flat(offset, s), *comm));
    ZR_RETURN_IF_ERROR(u->DropFullGrad(*comm));
    offset += s;
  }
  pending_.clear();
  pending_numel_ = 0;
  return absl::OkStatus();
}

Status GradientReducer::AllReduceBucket(const std::vector<ShardedUnit*>& bucket) {
  // One rank: the mean over ranks is the gradient itself (no copy through the communicator).
  if (bucket.empty() || DataRanks() == 1) return absl::OkStatus();
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
  auto in_group = [&](void* data, int64_t count) -> Status {
    if (resources_.dp->size() == 1) return absl::OkStatus();
    resources_.dp->SetTraceLabel(StrCat("all-reduce ", what));
    ZR_RETURN_IF_ERROR(resources_.dp->AllReduce(data, data, count, dtype, op, comm));
    resources_.dp->SetTraceLabel("");
    ++collectives_;
    return absl::OkStatus();
  };
  // Where this rank's shard starts in a unit's flat gradient.
  auto own = [](const ShardedUnit* u) { return u->layout_rank() * u->layout().shard_numel(); };
  if (bucket.size() == 1) {
    const TensorView g = bucket[0]->FullGrad();
    ZR_RETURN_IF_ERROR(in_group(g.data(), g.numel()));
    ZR_RETURN_IF_ERROR(AcrossReplicas(static_cast<char*>(g.data()) + own(bucket[0]) * elem,
                                      bucket[0]->layout().shard_numel(), op, what));
    return PostDivide(g, comm);
  }
  int64_t total = 0, shards = 0;
  for (ShardedUnit* u : bucket) {
    total += u->layout().padded_numel();
    shards += u->layout().shard_numel();
  }
  ZR_ASSIGN_OR_RETURN(Buffer packed, resources_.tiers.device->Allocate(
                                         total * elem, MemoryCategory::kCommBuffers, comm));
  // Every unit's full gradient into `packed` (in) or back out of it; with `shard`, only this
  // rank's shard of each, between `packed` and the consecutive shards at `shard`.
  auto move = [&](bool in, char* shard) -> Status {
    int64_t offset = 0, at = 0;
    for (ShardedUnit* u : bucket) {
      const TensorView g = u->FullGrad();
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
  ZR_RETURN_IF_ERROR(in_group(packed.data(), total));
  if (resources_.replicate != nullptr) {
    ZR_ASSIGN_OR_RETURN(Buffer own_shards, resources_.tiers.device->Allocate(
                                               shards * elem, MemoryCategory::kCommBuffers, comm));
    ZR_RETURN_IF_ERROR(move(false, own_shards.as<char>()));  // packed -> own_shards
    ZR_RETURN_IF_ERROR(AcrossReplicas(own_shards.data(), shards, op, what));
    ZR_RETURN_IF_ERROR(move(true, own_shards.as<char>()));  // own_shards -> packed
  }
  ZR_RETURN_IF_ERROR(PostDivide(TensorView(packed.data(), dtype, {total}, device), comm));
  return move(false, nullptr);
}

Status GradientReducer::Finish(std::vector<std::unique_ptr<ShardedUnit>>& units, bool reduce) {
  const ShardManagerOptions& o = *resources_.options;
  if (o.stage == ZeroStage::k2 || o.stage == ZeroStage::k3) {
    ZR_RETURN_IF_ERROR(FlushReduceScatter());
  } else if (reduce) {
    ZR_RETURN_IF_ERROR(CommAfterCompute());
    std::vector<ShardedUnit*> bucket;
    int64_t numel = 0;
    for (auto& u : units) {
      bucket.push_back(u.get());
      numel += u->layout().padded_numel();
      if (numel >= o.reduce_bucket_size) {
        ZR_RETURN_IF_ERROR(AllReduceBucket(bucket));
        bucket.clear();
        numel = 0;
      }
    }
    ZR_RETURN_IF_ERROR(AllReduceBucket(bucket));
  }
  // The optimizer, on the compute stream, reads what the comm stream produced.
  ZR_RETURN_IF_ERROR(event_->Record(*resources_.comm));
  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*event_));
  if (o.stage == ZeroStage::k0 || o.stage == ZeroStage::k1) {
    // This rank's slice of the all-reduced gradient becomes its gradient shard.
    for (auto& u : units) {
      const int64_t shard = u->layout().shard_numel();
      ZR_RETURN_IF_ERROR(optimizer_->AccumulateGradient(
          *u, u->FullGrad().Flat(u->layout_rank() * shard, shard), *resources_.compute));
      ZR_RETURN_IF_ERROR(u->ZeroFullGrad());
    }
  }
  // The host tiers' gradients in flight, added: the step reads them next.
  return optimizer_->FinishHostGradients();
}

}  // namespace zerort
