// ShardManager's setup: the options' checks, the memory tiers and the NVMe store, the parameter
// fetch buffers, registering units, and Initialize (every rank's agreement on the units and
// their initial values, each unit's first shards). The step's side is shard_manager.cc.
#include "zerort/sharding/shard_manager.h"

#include <algorithm>
#include <utility>

#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/unit_agreement.h"

namespace zerort {

ShardManager::ShardManager(const ShardManagerOptions& options, const Resources& resources)
    : options_(options),
      resources_(resources),
      scaler_(options.loss_scale, options.compute_dtype == DType::kF16) {}

ShardManager::~ShardManager() = default;

namespace {

bool IsHostTier(MemoryTier t) { return t == MemoryTier::kPinnedHost || t == MemoryTier::kHost; }

// DeepSpeed's rules: optimizer offload from stage 1, parameter offload at stage 3 only.
Status CheckPlacement(const ShardManagerOptions& o) {
  const ShardPlacement& p = o.placement;
  if (p.optimizer != MemoryTier::kDevice && o.stage == ZeroStage::k0) {
    return absl::InvalidArgumentError(
        "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage 0 keeps no optimizer shards)");
  }
  if (p.params != MemoryTier::kDevice && o.stage != ZeroStage::k3) {
    return absl::InvalidArgumentError(
        StrCat("offload_param needs ZeRO stage 3 (stage is ", static_cast<int>(o.stage), ")"));
  }
  if (p.params == MemoryTier::kNvme && p.optimizer != MemoryTier::kNvme) {
    return absl::InvalidArgumentError(
        "offload_param to nvme needs offload_optimizer on nvme too (the step writes the "
        "parameters it updates straight to their NVMe file)");
  }
  if (IsHostTier(p.optimizer) && IsHostTier(p.params) && p.optimizer != p.params) {
    return absl::InvalidArgumentError("offload_optimizer and offload_param disagree on pin_memory");
  }
  if ((p.optimizer == MemoryTier::kNvme || p.params == MemoryTier::kNvme) &&
      o.offload.nvme_path.empty()) {
    return absl::InvalidArgumentError("an nvme offload needs nvme_path");
  }
  if (o.offload.optimizer_buffer_count < 2 || o.offload.param_buffer_count < 1 ||
      o.offload.param_buffer_size < 1 || o.offload.sub_group_size < 0) {
    return absl::InvalidArgumentError(
        "offload buffers: optimizer buffer_count must be >= 2, param buffer_count and "
        "buffer_size >= 1, sub_group_size >= 0");
  }
  return absl::OkStatus();
}

// This rank's fp32 master shard of a unit, from whole parameters the initializer must generate
// identically on every rank; `hashes` gets InitialValuesHash of each parameter computed (0 for
// the others), for AgreeOnInitialValues.
std::vector<float> InitialShard(const FlatLayout& layout, int rank, const Initializer& init,
                                uint64_t seed, std::vector<uint64_t>& hashes) {
  std::vector<float> shard(static_cast<size_t>(layout.shard_numel()), 0.0f);
  const size_t first_hash = hashes.size();
  hashes.resize(first_hash + layout.params().size(), 0);
  for (const ShardPiece& piece : layout.ShardPieces(rank)) {
    const ParamSpec& spec = layout.params()[piece.param];
    std::vector<float> full(static_cast<size_t>(spec.numel()));
    init(spec, seed, full);
    hashes[first_hash + static_cast<size_t>(piece.param)] = InitialValuesHash(full);
    std::copy(full.begin() + piece.param_range.begin, full.begin() + piece.param_range.end,
              shard.begin() + piece.shard_range.begin);
  }
  return shard;
}

IoEngine EngineOf(const std::string& name) {
  return name == "io_uring"  ? IoEngine::kIoUring
         : name == "threads" ? IoEngine::kThreads
                             : IoEngine::kAuto;
}

}  // namespace

StatusOr<std::unique_ptr<ShardManager>> ShardManager::Create(const ShardManagerOptions& options,
                                                             const Resources& resources) {
  if (const int h = options.hpz_partition_size; h != 1) {
    if (options.stage != ZeroStage::k3 || h < 1) {
      return absl::InvalidArgumentError(
          StrCat("hpz_partition_size ", h, " needs stage 3 and a size of at least 1"));
    }
    if (resources.secondary == nullptr || resources.secondary->size() != h ||
        resources.dp == nullptr || resources.dp->size() % h != 0) {
      return absl::InvalidArgumentError(
          StrCat("hpz_partition_size ", h, " needs a secondary group of ", h,
                 " ranks dividing the data-parallel group (Resources::secondary)"));
    }
  }
  if (options.quantized_gradients &&
      (options.stage != ZeroStage::k3 || options.reduce_dtype != DType::kF32 ||
       !options.reduce_scatter || resources.grad_intra == nullptr ||
       (resources.replicate != nullptr && resources.replicate->size() > 1))) {
    return absl::InvalidArgumentError(
        "quantized_gradients (ZeRO++ qgZ) needs stage 3, fp32 reduction, reduce_scatter, the "
        "node groups (Resources::grad_intra) and no hybrid sharding");
  }
  if (options.quantized_weights && options.stage != ZeroStage::k3) {
    return absl::InvalidArgumentError("quantized_weights (ZeRO++ qwZ) needs stage 3");
  }
  if (IsOneBit(options.optimizer.kind) &&
      (options.stage != ZeroStage::k0 || options.placement.optimizer != MemoryTier::kDevice)) {
    return absl::InvalidArgumentError(
        "DeepSpeed's 1-bit optimizers (OptimizerKind::kOneBitAdam, kZeroOneAdam, kOneBitLamb) "
        "need stage 0 and the optimizer state on the device tier ([Note: 1-bit Adam])");
  }
  if (const OptimizerOptions& o = options.optimizer;
      o.kind == OptimizerKind::kOneBitLamb &&
      !(o.factor_min > 0 && o.factor_min <= o.factor_max && o.factor_threshold >= 0 &&
        o.coeff_beta >= 0 && o.coeff_beta < 1)) {
    return absl::InvalidArgumentError(StrCat(
        "1-bit LAMB needs 0 < factor_min <= factor_max, factor_threshold >= 0 and coeff_beta in "
        "[0, 1); got ",
        o.factor_min, ", ", o.factor_max, ", ", o.factor_threshold, ", ", o.coeff_beta));
  }
  if (resources.dp == nullptr || resources.device_allocator == nullptr) {
    return absl::InvalidArgumentError(
        "ShardManager needs a data-parallel group and a device allocator");
  }
  if (!IsFloatingPoint(options.compute_dtype) || !IsFloatingPoint(options.reduce_dtype)) {
    return absl::InvalidArgumentError("compute and reduce dtypes must be f32, bf16 or f16");
  }
  ZR_RETURN_IF_ERROR(CheckPlacement(options));
  if (options.gradient_clipping < 0) {
    return absl::InvalidArgumentError(
        StrCat("gradient_clipping ", options.gradient_clipping, " is negative"));
  }
  std::unique_ptr<ShardManager> m(new ShardManager(options, resources));
  const Device device = resources.device_allocator->device();
  if (m->resources_.compute == nullptr) {
    ZR_ASSIGN_OR_RETURN(m->owned_compute_, CreateStream(device, "compute", options.streams));
    m->resources_.compute = m->owned_compute_.get();
  }
  if (m->resources_.comm == nullptr) {
    // Exists to overlap all-gathers and reduce-scatters with the compute stream's kernels.
    ZR_ASSIGN_OR_RETURN(m->owned_comm_, CreateStream(device, "comm", options.streams));
    m->resources_.comm = m->owned_comm_.get();
  }
  if (options.offload.device_grad_sums && IsHostTier(options.placement.optimizer)) {
    // [Note: gradient sums on the device]: the next forward's kernels need not queue behind them.
    ZR_ASSIGN_OR_RETURN(m->owned_sums_, CreateStream(device, "grad sums", options.streams));
  }
  ZR_RETURN_IF_ERROR(m->CreateTiers());
  if (resources.tensor_parallel_rank < 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor-parallel rank ", resources.tensor_parallel_rank, " is negative"));
  }
  if (resources.tensor_parallel != nullptr &&
      resources.tensor_parallel->rank() != resources.tensor_parallel_rank) {
    return absl::InvalidArgumentError(StrCat(
        "tensor-parallel rank ", resources.tensor_parallel_rank, " is not this rank's index ",
        resources.tensor_parallel->rank(), " in Resources::tensor_parallel"));
  }
  const OptimizerKind kind = options.optimizer.kind;
  if ((kind == OptimizerKind::kLamb || kind == OptimizerKind::kOneBitLamb) &&
      resources.tensor_parallel_rank > 0 && resources.tensor_parallel == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("LAMB at tensor-parallel rank ", resources.tensor_parallel_rank,
               " needs Resources::tensor_parallel, the tensor-parallel group (a split "
               "parameter's norm spans it)"));
  }
  m->optimizer_ = std::make_unique<ShardedOptimizer>(
      OptimizerResources{&m->options_, resources.dp, m->tiers_, m->resources_.compute,
                         &m->offload_stats_, resources.tensor_parallel_rank == 0,
                         &m->resources_.span, m->owned_sums_.get(), resources.tensor_parallel});
  m->reducer_ = std::make_unique<GradientReducer>(m->UnitResourcesOf(), m->optimizer_.get());
  return m;
}

Status ShardManager::CreateTiers() {
  const ShardPlacement& p = options_.placement;
  tiers_.device = resources_.device_allocator;
  const bool host = IsHostTier(p.optimizer) || IsHostTier(p.params);
  const bool nvme = p.optimizer == MemoryTier::kNvme || p.params == MemoryTier::kNvme;
  if (!host && !nvme) return absl::OkStatus();
  tiers_.host = resources_.host_allocator;
  if (tiers_.host == nullptr) {
    // Staging for NVMe is pinned, as DeepSpeed's; a host tier takes the tier it names.
    const MemoryTier tier = IsHostTier(p.optimizer) ? p.optimizer
                            : IsHostTier(p.params)  ? p.params
                                                    : MemoryTier::kPinnedHost;
    if (resources_.device_allocator->device().is_cuda() && tier == MemoryTier::kPinnedHost) {
      ZR_ASSIGN_OR_RETURN(owned_host_, MakePinnedHostAllocator(resources_.tracker));
    } else {
      owned_host_ = MakeCpuCachingAllocator(resources_.tracker, tier);
    }
    tiers_.host = owned_host_.get();
  }
  if (resources_.device_allocator->device().is_cuda()) {
    if (tiers_.host->tier() == MemoryTier::kPinnedHost) {
      tiers_.staging = tiers_.host;
    } else {
      ZR_ASSIGN_OR_RETURN(owned_staging_, MakePinnedHostAllocator(resources_.tracker));
      tiers_.staging = owned_staging_.get();
    }
  }
  if (nvme) {
    const OffloadOptions& o = options_.offload;
    NvmeStoreOptions n;
    n.dir = o.nvme_path;
    n.file_tag = StrCat("zerort-rank", resources_.dp->rank());
    n.engine = EngineOf(o.aio_engine);
    n.block_bytes = o.aio_block_size;
    n.queue_depth = o.aio_queue_depth;
    n.thread_count = o.aio_thread_count;
    n.single_submit = o.aio_single_submit;
    n.overlap_events = o.aio_overlap_events;
    n.tracker = resources_.tracker;
    n.fail_request = o.fail_io_request;
    n.fail_errno = o.fail_io_errno;
    ZR_ASSIGN_OR_RETURN(nvme_, NvmeStore::Create(n));
    tiers_.nvme = nvme_.get();
  }
  return absl::OkStatus();
}

int64_t ParamFetchBufferNumel(const ShardManagerOptions& options, int64_t largest_offloaded_shard) {
  return std::max<int64_t>(std::min(options.offload.param_buffer_size, largest_offloaded_shard), 1);
}

// The parameter fetch buffers (offload_param nvme), once the units say how large they must be.
Status ShardManager::CreateParamStaging() {
  if (options_.placement.params != MemoryTier::kNvme) return absl::OkStatus();
  int64_t largest = 0;
  const ShardedUnit* largest_unit = nullptr;
  for (const auto& u : units_) {
    if (u->persistent()) continue;
    // Every offloaded compute shard must fit one fetch buffer (offload_param.buffer_size).
    if (u->layout().shard_numel() > options_.offload.param_buffer_size) {
      return absl::InvalidArgumentError(
          StrCat("offload_param.buffer_size ", options_.offload.param_buffer_size,
                 " elements is smaller than unit '", u->name(), "''s shard of ",
                 u->layout().shard_numel(), " elements: raise it to at least that"));
    }
    if (u->layout().shard_numel() > largest) {
      largest = u->layout().shard_numel();
      largest_unit = u.get();
    }
  }
  const int64_t numel = ParamFetchBufferNumel(options_, largest);
  const int64_t bytes = numel * static_cast<int64_t>(DTypeSize(options_.compute_dtype));
  StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(
      *tiers_.host, options_.offload.param_buffer_count, static_cast<size_t>(bytes));
  if (!pool.ok()) {
    return Annotate(pool.status(),
                    "offload_param fetch buffers (buffer_count x the largest shard)");
  }
  param_staging_ = std::move(*pool);
  const std::string why = largest_unit != nullptr ? StrCat("the largest offloaded shard, unit '",
                                                           largest_unit->name(), "'")
                                                  : std::string("no unit is offloaded");
  Logger()->info(
      "offload_param: {} fetch buffers of {} elements ({:.1f} MiB in all): {} "
      "(offload_param.buffer_size {} is the most)",
      options_.offload.param_buffer_count, numel,
      static_cast<double>(StagingPool::AllocationBytes(options_.offload.param_buffer_count,
                                                       static_cast<size_t>(bytes))) /
          (1 << 20),
      why, options_.offload.param_buffer_size);
  return absl::OkStatus();
}

UnitResources ShardManager::UnitResourcesOf() {
  Communicator* replicate = resources_.replicate != nullptr && resources_.replicate->size() > 1
                                ? resources_.replicate
                                : nullptr;
  return UnitResources{&options_,
                       resources_.dp,
                       tiers_,
                       resources_.compute,
                       resources_.comm,
                       &param_staging_,
                       &offload_stats_,
                       replicate,
                       options_.hpz_partition_size > 1 ? resources_.secondary : nullptr,
                       options_.quantized_gradients ? resources_.grad_intra : nullptr,
                       options_.quantized_gradients ? resources_.grad_inter : nullptr};
}

// Before anything is written: does this rank's NVMe state fit where it goes?
Status ShardManager::CheckNvmeSpace() const {
  if (!nvme_) return absl::OkStatus();
  int64_t bytes = 0;
  for (const auto& u : units_) {
    for (const PlannedBuffer& b : u->plan().buffers) {
      if (b.tier == MemoryTier::kNvme) {  // as NvmeStore::Reserve rounds a region
        bytes +=
            (b.bytes() + NvmeStore::kAlignment - 1) / NvmeStore::kAlignment * NvmeStore::kAlignment;
      }
    }
  }
  return NvmeStore::CheckFreeSpace(options_.offload.nvme_path, bytes,
                                   StrCat("the offloaded state of rank ", resources_.dp->rank()));
}

StatusOr<int> ShardManager::AddUnit(std::string name, std::vector<ParamSpec> params,
                                    const UnitOptions& unit_options) {
  if (initialized_)
    return absl::FailedPreconditionError(StrCat("unit '", name, "' added after Initialize"));
  for (const auto& u : units_) {
    if (u->name() == name)
      return absl::InvalidArgumentError(StrCat("unit '", name, "' added twice"));
  }
  if (unit_options.tied != nullptr && options_.placement.optimizer == MemoryTier::kNvme) {
    return absl::UnimplementedError(
        StrCat("unit '", name,
               "' is tied across pipeline stages, which needs the optimizer "
               "state in memory: offload_optimizer to nvme is not supported with it yet"));
  }
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<ShardedUnit> unit,
                      ShardedUnit::Create(std::move(name), std::move(params), UnitResourcesOf(),
                                          options_.placement.optimizer));
  units_.push_back(std::move(unit));
  unit_options_.push_back(unit_options);
  scopes_since_step_.push_back(0);
  const std::string& n = units_.back()->name();
  const std::string rank = StrCat(resources_.dp->rank(), "/", resources_.dp->size(), ")");
  scope_names_.push_back({std::make_shared<const std::string>(
                              StrCat("unit '", n, "' (Forward scope, data-parallel rank ", rank)),
                          std::make_shared<const std::string>(StrCat(
                              "unit '", n, "' (Backward scope, data-parallel rank ", rank))});
  return static_cast<int>(units_.size() - 1);
}

// [Note: partial optimizer offload] (options.h): each unit's optimizer tier, now that the units
// are known. AddUnit planned every unit on the placement's tier; the device-tier ones are planned
// again (nothing is allocated before Initialize).
Status ShardManager::PlaceOptimizerState() {
  const int n = num_units();
  const int on_device = DeviceOptimizerUnits(options_, n);
  if (options_.placement.optimizer == MemoryTier::kDevice || on_device == 0) {
    return absl::OkStatus();
  }
  int64_t host_params = 0, all_params = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t numel = units_[i]->layout().params_numel();
    all_params += numel;
    if (i >= on_device) {
      host_params += numel;
      continue;
    }
    const ShardedUnit& old = *units_[i];
    ZR_ASSIGN_OR_RETURN(units_[i], ShardedUnit::Create(old.name(), old.layout().params(),
                                                       UnitResourcesOf(), MemoryTier::kDevice));
  }
  if (resources_.dp->rank() == 0 && on_device == n) {
    Logger()->info("offload_optimizer.ratio = {}: every unit's optimizer state on the device",
                   options_.offload.optimizer_ratio);
  } else if (resources_.dp->rank() == 0) {
    Logger()->info(
        "offload_optimizer.ratio = {}: the optimizer state of the last {} of {} units ({} of {} "
        "parameters, from unit '{}') on the host, of the first {} on the device",
        options_.offload.optimizer_ratio, n - on_device, n, host_params, all_params,
        units_[on_device]->name(), on_device);
  }
  return absl::OkStatus();
}

// [Note: every rank registers the same units] (sharding/unit_agreement.h): what must agree.
std::vector<std::string> ShardManager::UnitEntries() const {
  std::vector<std::string> entries = {StrCat("ZeRO stage ", static_cast<int>(options_.stage),
                                             ", compute ", DTypeName(options_.compute_dtype),
                                             ", reduce ", DTypeName(options_.reduce_dtype))};
  for (const auto& u : units_) {
    std::string e = StrCat("unit '", u->name(), "':");
    for (const ParamSpec& p : u->layout().params()) {
      e += StrCat(" ", p.name, " ", ShapeToString(p.shape), " of ", ShapeToString(p.global_shape()),
                  p.weight_decay ? "" : " (no decay)");
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

Status ShardManager::Initialize(const Initializer& init) {
  if (initialized_) return absl::FailedPreconditionError("Initialize called twice");
  if (units_.empty()) return absl::FailedPreconditionError("no units were added");
  ZR_RETURN_IF_ERROR(AgreeOnUnits(*resources_.dp, *resources_.device_allocator, *resources_.compute,
                                  UnitEntries()));
  ZR_RETURN_IF_ERROR(PlaceOptimizerState());
  ZR_RETURN_IF_ERROR(CheckNvmeSpace());
  ZR_RETURN_IF_ERROR(CreateParamStaging());
  std::vector<uint64_t> hashes;
  std::vector<std::string> names;
  for (auto& u : units_) {
    std::vector<float> initial =
        InitialShard(u->layout(), u->layout_rank(), init, options_.seed, hashes);
    for (const ParamSpec& p : u->layout().params()) {
      names.push_back(StrCat("'", p.name, "' of unit '", u->name(), "'"));
    }
    ZR_ASSIGN_OR_RETURN(TensorView master, optimizer_->AddUnit(*u, initial));
    ZR_RETURN_IF_ERROR(u->Initialize(master));
  }
  ZR_RETURN_IF_ERROR(AgreeOnInitialValues(*resources_.dp, *resources_.device_allocator,
                                          *resources_.compute, hashes, names));
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!unit_options_[i].counts_in_norm) optimizer_->ExcludeFromNorm(static_cast<int>(i));
  }
  ZR_RETURN_IF_ERROR(optimizer_->Finalize());
  ZR_RETURN_IF_ERROR(resources_.compute->Synchronize());
  std::vector<GatherPlanner::UnitInfo> infos;
  for (const auto& u : units_) {
    infos.push_back({u->layout().padded_numel(), u->persistent()});
  }
  planner_ = std::make_unique<GatherPlanner>(GatherBudgets::From(options_), std::move(infos));
  const bool all_persistent =
      std::all_of(units_.begin(), units_.end(), [](const auto& u) { return u->persistent(); });
  if (options_.stage == ZeroStage::k3 && all_persistent && resources_.dp->size() > 1 &&
      resources_.dp->rank() == 0) {
    // A small model's units all stay gathered: ZeRO-3 then shards nothing, and a weight read
    // outside its scope goes unnoticed until a model large enough to shard.
    Logger()->warn(
        "ZeRO-3: every unit has fewer than stage3_param_persistence_threshold = {} elements, so "
        "every unit stays gathered on every rank (nothing is sharded); set it lower (0 shards "
        "every unit) to shard this model",
        options_.stage3_param_persistence_threshold);
  }
  const auto in_place = std::count_if(units_.begin(), units_.end(),
                                      [](const auto& u) { return u->plan().gathers_in_place; });
  if (in_place > 0 && resources_.dp->rank() == 0) {
    Logger()->info(
        "ZeRO-3 over one shard rank: {} of {} units read their compute shards in place (nothing "
        "is sharded, so nothing is gathered or freed; sharding/unit_plan.cc, [Note: one shard "
        "rank])",
        in_place, units_.size());
  }
  settled_ = num_units();  // no step to complete
  initialized_ = true;
  return absl::OkStatus();
}

}  // namespace zerort
