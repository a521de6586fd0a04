// ShardedUnit: compute copies and the shard state machine (with the fetch of offloaded shards).
#include "zerort/sharding/sharded_unit.h"

#include <chrono>

#include "zerort/kernels/cast.h"
#include "zerort/kernels/quantize.h"
#include "zerort/runtime/strings.h"

namespace zerort {

std::string_view ShardStateName(ShardState state) {
  switch (state) {
    case ShardState::kSharded:
      return "SHARDED";
    case ShardState::kFetching:
      return "FETCHING";
    case ShardState::kGathering:
      return "GATHERING";
    case ShardState::kUnsharded:
      return "UNSHARDED";
  }
  return "invalid";
}

StatusOr<std::unique_ptr<ShardedUnit>> ShardedUnit::Create(std::string name,
                                                           std::vector<ParamSpec> params,
                                                           const UnitResources& r,
                                                           MemoryTier optimizer_tier) {
  if (r.options == nullptr || r.dp == nullptr || r.tiers.device == nullptr ||
      r.compute == nullptr || r.comm == nullptr) {
    return absl::InvalidArgumentError(StrCat("unit '", name, "': missing resources"));
  }
  StatusOr<FlatLayout> layout = FlatLayout::Create(
      std::move(params), ShardCount(r.options->stage, r.dp->size()), r.options->alignment);
  if (!layout.ok()) return Annotate(layout.status(), StrCat("unit '", name, "'"));
  return std::unique_ptr<ShardedUnit>(
      new ShardedUnit(std::move(name), std::move(*layout), r, optimizer_tier));
}

ShardedUnit::ShardedUnit(std::string name, FlatLayout layout, const UnitResources& resources,
                         MemoryTier optimizer_tier)
    : name_(std::move(name)),
      layout_(std::move(layout)),
      plan_(PlanUnit(*resources.options, layout_, resources.dp->size(), optimizer_tier)),
      resources_(resources),
      grad_(name_, layout_, resources.options->reduce_dtype, *resources.tiers.device,
            *resources.compute, resources.options->poison_released) {
  rank_ = plan_.partitioning == Partitioning::kReplicated ? 0 : resources_.dp->rank();
}

ShardedUnit::~ShardedUnit() = default;

Status ShardedUnit::Fail(const Status& status) const {
  return Annotate(status, StrCat("unit '", name_, "'"));
}

int64_t ShardedUnit::gathered_bytes() const {
  return layout_.padded_numel() * static_cast<int64_t>(DTypeSize(options().compute_dtype));
}

Status ShardedUnit::Allocate(PlacedBuffer* buffer, UnitBuffer which) {
  const PlannedBuffer* planned = plan_.Find(which);
  ZR_CHECK(planned != nullptr) << "unit '" << name_ << "' plans no " << UnitBufferName(which);
  StatusOr<PlacedBuffer> b = PlacedBuffer::Allocate(*planned, resources_.tiers, resources_.compute);
  if (!b.ok()) return Fail(b.status());
  *buffer = std::move(*b);
  return absl::OkStatus();
}

namespace {

// Writes fp32 `values` (any device) cast to dst's dtype at element `offset` of `dst` (any tier).
Status CastInto(const TensorView& values, PlacedBuffer& dst, int64_t offset, const Tiers& tiers,
                Stream* stream) {
  const int64_t n = values.numel();
  const Device device = tiers.device->device();
  TensorView src = values;
  Buffer host_values;  // fp32 values copied to the host, for host or NVMe destinations on CUDA
  if (!dst.in_memory() || dst.View().device().is_cpu()) {
    if (!values.device().is_cpu()) {
      ZR_ASSIGN_OR_RETURN(host_values,
                          tiers.StagingOrHost()->Allocate(n * 4, MemoryCategory::kStaging));
      ZR_RETURN_IF_ERROR(CopyBytes(host_values.data(), Device::Cpu(), values.data(),
                                   values.device(), n * 4, stream));
      ZR_RETURN_IF_ERROR(stream->Synchronize());
      src = TensorView(host_values.data(), DType::kF32, {n}, Device::Cpu());
    }
  }
  if (dst.in_memory()) {
    TensorView out = dst.View().Flat(offset, n);
    if (out.device() == src.device()) {
      // `values` may be the caller's host memory, gone when this returns: a queued stream must
      // have read it by then.
      ZR_RETURN_IF_ERROR(Cast(src, out, stream));
      return stream->Synchronize();
    }
    // Host fp32 values into device memory (CUDA with an offloaded master).
    ZR_ASSIGN_OR_RETURN(Buffer staged,
                        tiers.device->Allocate(n * 4, MemoryCategory::kStaging, stream));
    ZR_RETURN_IF_ERROR(CopyBytes(staged.data(), device, src.data(), Device::Cpu(), n * 4, stream));
    ZR_RETURN_IF_ERROR(Cast(TensorView(staged.data(), DType::kF32, {n}, device), out, stream));
    return stream->Synchronize();
  }
  // NVMe: cast into an aligned host buffer, then one write of the region.
  const int64_t bytes = n * static_cast<int64_t>(DTypeSize(dst.dtype()));
  ZR_CHECK(offset == 0 && n == dst.numel()) << "partial initial write of an NVMe buffer";
  ZR_ASSIGN_OR_RETURN(AlignedHostBuffer staged, AllocateAligned(*tiers.host, bytes));
  ZR_RETURN_IF_ERROR(Cast(src, TensorView(staged.data, dst.dtype(), {n}, Device::Cpu()), nullptr));
  return tiers.nvme->StartWrite(dst.region(), 0, staged.data, bytes).Finish();
}

}  // namespace

Status ShardedUnit::Initialize(const TensorView& master) {
  ZR_CHECK(!initialized_) << "unit '" << name_ << "' initialised twice";
  ZR_CHECK(master.numel() == layout_.shard_numel()) << "unit '" << name_ << "': master size";
  Stream* compute = resources_.compute;
  if (plan_.compute_is_master) {
    ZR_CHECK(master.device() == device()) << "stage 0 keeps the master on the device";
    master_alias_ = master;
  }
  if (plan_.Has(UnitBuffer::kComputeShard)) {
    ZR_RETURN_IF_ERROR(Allocate(&compute_shard_, UnitBuffer::kComputeShard));
    ZR_RETURN_IF_ERROR(Fail(CastInto(master, compute_shard_, 0, resources_.tiers, compute)));
  }
  if (plan_.Has(UnitBuffer::kSecondary)) {
    ZR_CHECK(resources_.secondary != nullptr &&
             resources_.secondary->size() == options().hpz_partition_size &&
             layout_.padded_numel() % resources_.secondary->size() == 0)
        << "unit '" << name_ << "': hpZ needs a secondary group of hpz_partition_size ranks";
    ZR_RETURN_IF_ERROR(Allocate(&secondary_, UnitBuffer::kSecondary));
  }
  if (plan_.Has(UnitBuffer::kComputeFull)) {
    ZR_RETURN_IF_ERROR(Allocate(&compute_full_, UnitBuffer::kComputeFull));
    const ComputeCopy own = compute_copy();
    ZR_RETURN_IF_ERROR(
        Fail(CastInto(master, compute_full_, own.offset, resources_.tiers, compute)));
    if (plan_.partitioning == Partitioning::kSharded) ZR_RETURN_IF_ERROR(GatherUpdated(compute));
  }
  const PlannedBuffer* full_grad = plan_.Find(UnitBuffer::kFullGrad);
  if (full_grad->lifetime == Lifetime::kPersistent) ZR_RETURN_IF_ERROR(grad_.BeginBackward());
  ZR_ASSIGN_OR_RETURN(gathered_event_, CreateEvent(device()));
  ZR_ASSIGN_OR_RETURN(written_event_, CreateEvent(device()));
  ZR_RETURN_IF_ERROR(written_event_->Record(*resources_.compute));  // the initial values
  initialized_ = true;
  if (!plan_.sharded_params || plan_.gathers_in_place) {
    state_ = ShardState::kUnsharded;  // [Note: one shard rank]: the compute shard is read
  } else if (persistent()) {
    ZR_RETURN_IF_ERROR(StartGather());  // once, through the ordinary path; then kept
    ZR_RETURN_IF_ERROR(FinishGather());
  }
  return absl::OkStatus();
}

Status ShardedUnit::StartFetch() {
  if (state_ != ShardState::kSharded || compute_shard_.in_memory() || secondary_valid_) {
    return absl::OkStatus();
  }
  ZR_CHECK(resources_.param_staging != nullptr && *resources_.param_staging != nullptr)
      << "unit '" << name_ << "': no fetch buffers";
  StagingPool& pool = **resources_.param_staging;
  ZR_CHECK(compute_shard_.region().capacity <= static_cast<int64_t>(pool.buffer_bytes()))
      << "unit '" << name_ << "': shard larger than a parameter fetch buffer";
  ZR_ASSIGN_OR_RETURN(fetch_lease_, pool.Acquire());
  fetch_io_ = resources_.tiers.nvme->StartRead(compute_shard_.region(), 0, fetch_lease_.data,
                                               compute_shard_.bytes());
  state_ = ShardState::kFetching;
  return absl::OkStatus();
}

Status ShardedUnit::CancelFetch() {
  if (state_ != ShardState::kFetching) return absl::OkStatus();
  const Status read = fetch_io_.Finish();
  fetch_io_ = IoHandle();
  (*resources_.param_staging)->Return(std::exchange(fetch_lease_, {}));
  state_ = ShardState::kSharded;
  return read.ok() ? absl::OkStatus() : Fail(Annotate(read, "fetching its compute shard"));
}

Status ShardedUnit::StartGather() {
  ZR_CHECK(initialized_ && plan_.sharded_params &&
           (state_ == ShardState::kSharded || state_ == ShardState::kFetching))
      << "StartGather on unit '" << name_ << "' in state " << ShardStateName(state_);
  if (secondary_valid_ && state_ == ShardState::kSharded) return GatherSecondary();
  Stream* comm = resources_.comm;
  ZR_RETURN_IF_ERROR(StartFetch());
  const int64_t shard_bytes = compute_shard_.bytes();
  const void* input = nullptr;
  Device input_device = Device::Cpu();
  if (state_ == ShardState::kFetching) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status read = fetch_io_.Finish();
    if (resources_.stats != nullptr) {
      resources_.stats->fetch_wait_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    fetch_io_ = IoHandle();
    if (!read.ok()) {
      (*resources_.param_staging)->Return(std::exchange(fetch_lease_, {}));
      state_ = ShardState::kSharded;
      return Fail(Annotate(read, "fetching its compute shard"));
    }
    input = fetch_lease_.data;
  } else {
    input = compute_shard_.View().data();
    input_device = compute_shard_.View().device();
  }
  // The compute shard was last written on the compute stream (the step, or a load): wait for
  // that write only, not for the compute work issued since (the kernels this gather overlaps).
  ZR_RETURN_IF_ERROR(comm->WaitEvent(*written_event_));
  Buffer on_device;  // an offloaded shard copied to the GPU for the all-gather (CUDA only)
  if (device().is_cuda() && input_device.is_cpu()) {
    ZR_ASSIGN_OR_RETURN(on_device, resources_.tiers.device->Allocate(
                                       shard_bytes, MemoryCategory::kCommBuffers, comm));
    ZR_RETURN_IF_ERROR(
        CopyBytes(on_device.data(), device(), input, Device::Cpu(), shard_bytes, comm));
    input = on_device.data();
  }
  StatusOr<Buffer> gathered =
      resources_.tiers.device->Allocate(gathered_bytes(), MemoryCategory::kGatheredWeights, comm);
  if (!gathered.ok()) return Annotate(gathered.status(), StrCat("gathering unit '", name_, "'"));
  gathered_ = std::move(*gathered);
  TrimPoisoned();
  resources_.dp->recorder().SetLabel(StrCat("gather ", name_));
  if (options().quantized_weights) {
    ZR_RETURN_IF_ERROR(GatherQuantized(input, comm));
  } else {
    ZR_RETURN_IF_ERROR(
        GatherShards(*resources_.dp, input, gathered_.data(), layout_.shard_numel(), comm));
  }
  resources_.dp->recorder().SetLabel("");
  if (secondary_) ZR_RETURN_IF_ERROR(KeepSecondary(comm));
  ZR_RETURN_IF_ERROR(gathered_event_->Record(*comm));
  if (fetch_lease_) {
    std::vector<Fence> fences;
    // The copy (CUDA) or the gather (a queued CPU stream) reads the staging buffer later, on the
    // comm stream: the buffer goes back to the pool once the stream has passed that point.
    if (comm->asynchronous()) {
      ZR_ASSIGN_OR_RETURN(std::shared_ptr<Event> copied, CreateEvent(device()));
      ZR_RETURN_IF_ERROR(copied->Record(*comm));
      fences.push_back([copied] { return copied->Synchronize(); });
    }
    (*resources_.param_staging)->Return(std::exchange(fetch_lease_, {}), std::move(fences));
  }
  if (on_device) {
    ZR_RETURN_IF_ERROR(resources_.tiers.device->RecordStream(on_device, *comm));
  }
  state_ = ShardState::kGathering;
  return absl::OkStatus();
}

// qwZ (ShardManagerOptions::quantized_weights): this rank's shard quantized, every rank's
// quantized shard all-gathered as bytes, then each dequantized into its place in the flat vector
// (the rank's own too, so every rank reads the same weights).
Status ShardedUnit::GatherQuantized(const void* shard, Stream* comm) {
  const int64_t n = layout_.shard_numel();
  const DType dtype = options().compute_dtype;
  const int64_t bytes = QuantizedBytes(n);
  const int ranks = resources_.dp->size();
  Allocator& device_memory = *resources_.tiers.device;
  ZR_ASSIGN_OR_RETURN(Buffer mine,
                      device_memory.Allocate(bytes, MemoryCategory::kCommBuffers, comm));
  ZR_ASSIGN_OR_RETURN(Buffer all,
                      device_memory.Allocate(bytes * ranks, MemoryCategory::kCommBuffers, comm));
  ZR_RETURN_IF_ERROR(
      QuantizeInt8(TensorView(const_cast<void*>(shard), dtype, {n}, device()), mine.data(), comm));
  ZR_RETURN_IF_ERROR(resources_.dp->AllGather(mine.data(), all.data(), static_cast<size_t>(bytes),
                                              DType::kU8, comm));
  const TensorView flat(gathered_.data(), dtype, {layout_.padded_numel()}, device());
  for (int r = 0; r < ranks; ++r) {
    ZR_RETURN_IF_ERROR(DequantizeInt8(all.as<char>() + r * bytes, flat.Flat(r * n, n), comm));
  }
  return absl::OkStatus();  // both buffers were allocated for the comm stream and used only there
}

// [Note: hpZ]: this rank's piece of the flat vector just gathered (on the comm stream, before
// the gathered event), in its secondary group's frame.
Status ShardedUnit::KeepSecondary(Stream* comm) {
  const int64_t piece = secondary_.View().numel();
  const size_t bytes = static_cast<size_t>(piece) * DTypeSize(options().compute_dtype);
  const char* from =
      static_cast<const char*>(gathered_.data()) + resources_.secondary->rank() * bytes;
  ZR_RETURN_IF_ERROR(CopyBytes(secondary_.View().data(), device(), from, device(), bytes, comm));
  secondary_valid_ = true;
  return absl::OkStatus();
}

Status ShardedUnit::GatherSecondary() {
  Stream* comm = resources_.comm;
  StatusOr<Buffer> gathered =
      resources_.tiers.device->Allocate(gathered_bytes(), MemoryCategory::kGatheredWeights, comm);
  if (!gathered.ok()) return Annotate(gathered.status(), StrCat("gathering unit '", name_, "'"));
  gathered_ = std::move(*gathered);
  TrimPoisoned();
  Communicator& group = *resources_.secondary;
  group.recorder().SetLabel(StrCat("gather ", name_, " (hpZ)"));
  ZR_RETURN_IF_ERROR(GatherShards(group, secondary_.View().data(), gathered_.data(),
                                  secondary_.View().numel(), comm));
  group.recorder().SetLabel("");
  ZR_RETURN_IF_ERROR(gathered_event_->Record(*comm));
  state_ = ShardState::kGathering;
  return absl::OkStatus();
}

Status ShardedUnit::FinishGather() {
  if (state_ == ShardState::kUnsharded) return absl::OkStatus();
  ZR_CHECK(state_ == ShardState::kGathering)
      << "FinishGather on unit '" << name_ << "' in state " << ShardStateName(state_);
  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*gathered_event_));
  ZR_RETURN_IF_ERROR(resources_.tiers.device->RecordStream(gathered_, *resources_.compute));
  state_ = ShardState::kUnsharded;
  return absl::OkStatus();
}

Status ShardedUnit::Release() {
  if (persistent()) return absl::OkStatus();
  ZR_CHECK(state_ == ShardState::kUnsharded)
      << "Release of unit '" << name_ << "' in state " << ShardStateName(state_);
  if (options().poison_released) {
    ZR_RETURN_IF_ERROR(Fail(
        FillBytes(gathered_.data(), device(), gathered_.bytes(), kPoisonByte, resources_.compute)));
    poisoned_.push_back(std::move(gathered_));  // [Note: poisoned buffers]
  }
  gathered_.Reset();  // reused only once the compute stream has finished reading it
  state_ = ShardState::kSharded;
  return absl::OkStatus();
}

// [Note: poisoned buffers]
// Under poison_released a released gathered buffer is filled with 0xFF, a NaN in every float
// dtype, so that a raw pointer kept past its scope reads NaN. Given back to the allocator at once,
// it would be handed to this unit's next gather (the same size, the same order of allocations
// every step), and a stale pointer would read the unit's correct weights again by luck, from the
// second step on. So the unit keeps its released buffers poisoned and gives the older back only
// after its next gather has allocated another (at most two held): its gathers then cycle through
// three buffers, a pointer kept from one gather reads NaN at the next, and a model that keeps one
// sees a NaN loss at once. Costs up to two gathered buffers per unit, in debug runs only.
void ShardedUnit::TrimPoisoned() {
  while (poisoned_.size() > 1) poisoned_.pop_front();
}

TensorView ShardedUnit::ComputeFlat() const {
  const ShardManagerOptions& o = options();
  if (plan_.gathers_in_place) return compute_shard_.View();  // [Note: one shard rank]
  if (plan_.sharded_params) {
    return TensorView(gathered_.data(), o.compute_dtype, {layout_.padded_numel()}, device());
  }
  return plan_.compute_is_master ? master_alias_ : compute_full_.View();
}

TensorView ShardedUnit::Param(int i) {
  ZR_CHECK(state_ == ShardState::kUnsharded)
      << "parameter " << i << " of unit '" << name_ << "' read in state " << ShardStateName(state_);
  const Range flat = layout_.flat_range(i);
  return ComputeFlat().Flat(flat.begin, flat.size()).Reshape(layout_.params()[i].shape);
}

ComputeCopy ShardedUnit::compute_copy() {
  if (plan_.sharded_params) return {&compute_shard_, 0};
  if (plan_.compute_is_master) return {};
  return {&compute_full_,
          plan_.partitioning == Partitioning::kSharded ? rank_ * layout_.shard_numel() : 0};
}

Status ShardedUnit::SetComputeFromMaster(const TensorView& master) {
  const ComputeCopy copy = compute_copy();
  if (copy.buffer == nullptr) return absl::OkStatus();  // the model reads the master itself
  return Fail(CastInto(master, *copy.buffer, copy.offset, resources_.tiers, resources_.compute));
}

Status ShardedUnit::RefreshAfterStep() {
  secondary_valid_ = false;  // [Note: hpZ]: the step changed the weights
  Stream* compute = resources_.compute;
  ZR_RETURN_IF_ERROR(written_event_->Record(*compute));  // the compute shard's values are final
  const int64_t shard = layout_.shard_numel();
  if (!plan_.sharded_params) {
    if (plan_.partitioning == Partitioning::kReplicated) return absl::OkStatus();
    resources_.dp->recorder().SetLabel(StrCat("all-gather updated ", name_));
    ZR_RETURN_IF_ERROR(GatherUpdated(compute));
    resources_.dp->recorder().SetLabel("");
    return absl::OkStatus();
  }
  if (!persistent()) {
    ZR_CHECK(state_ == ShardState::kSharded)
        << "optimizer step while unit '" << name_ << "' is " << ShardStateName(state_);
    return absl::OkStatus();
  }
  if (plan_.gathers_in_place) return absl::OkStatus();  // the updated shard is what is read
  return GatherShards(*resources_.dp, compute_shard_.View().data(), gathered_.data(), shard,
                      compute);
}

Status ShardedUnit::GatherUpdated(Stream* stream) {
  const int64_t shard = layout_.shard_numel();
  const int world = resources_.dp->size();
  const DType dtype = options().compute_dtype;
  const size_t elem = DTypeSize(dtype);
  char* full = static_cast<char*>(compute_full_.View().data());
  char* own = full + static_cast<size_t>(compute_copy().offset) * elem;
  const int64_t bucket = options().allgather_bucket_size;
  if (world == 1 || shard * world <= bucket) {
    return GatherShards(*resources_.dp, own, full, shard, stream);
  }
  // DeepSpeed's all_gather_dp_groups: pieces of every rank's shard, world x piece <= bucket.
  const int64_t piece = std::max<int64_t>(1, bucket / world);
  auto at = [&](int r, int64_t offset) {
    return full + (static_cast<size_t>(r) * shard + offset) * elem;
  };
  if (!options().allgather_partitions) {  // broadcasts write each piece in place
    for (int64_t offset = 0; offset < shard; offset += piece) {
      const int64_t n = std::min(piece, shard - offset);
      for (int r = 0; r < world; ++r) {
        ZR_RETURN_IF_ERROR(
            resources_.dp->Broadcast(at(r, offset), static_cast<size_t>(n), dtype, r, stream));
      }
    }
    return absl::OkStatus();
  }
  ZR_ASSIGN_OR_RETURN(Buffer staging,
                      resources_.tiers.device->Allocate(piece * world * static_cast<int64_t>(elem),
                                                        MemoryCategory::kCommBuffers, stream));
  char* staged = static_cast<char*>(staging.data());
  for (int64_t offset = 0; offset < shard; offset += piece) {
    const int64_t n = std::min(piece, shard - offset);
    const size_t bytes = static_cast<size_t>(n) * elem;
    ZR_RETURN_IF_ERROR(
        resources_.dp->AllGather(at(resources_.dp->rank(), offset), staged, n, dtype, stream));
    for (int r = 0; r < world; ++r) {
      if (r == resources_.dp->rank()) continue;  // this rank's piece is in place
      ZR_RETURN_IF_ERROR(
          CopyBytes(at(r, offset), device(), staged + r * bytes, device(), bytes, stream));
    }
  }
  return absl::OkStatus();
}

Status ShardedUnit::GatherShards(Communicator& group, const void* mine, void* all, int64_t shard,
                                 Stream* stream) {
  const DType dtype = options().compute_dtype;
  if (options().allgather_partitions) return group.AllGather(mine, all, shard, dtype, stream);
  const size_t bytes = static_cast<size_t>(shard) * DTypeSize(dtype);
  char* base = static_cast<char*>(all);
  char* own = base + static_cast<size_t>(group.rank()) * bytes;
  if (own != mine) ZR_RETURN_IF_ERROR(CopyBytes(own, device(), mine, device(), bytes, stream));
  for (int r = 0; r < group.size(); ++r) {
    ZR_RETURN_IF_ERROR(group.Broadcast(base + static_cast<size_t>(r) * bytes,
                                       static_cast<size_t>(shard), dtype, r, stream));
  }
  return absl::OkStatus();
}

}  // namespace zerort
