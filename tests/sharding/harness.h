// The training harness of the shard-manager tests: the MLP trained through the manager on any
// communicator (loopback ranks or MPI processes), the unsharded reference run, and the
// comparison metric.
#pragma once

#include <cmath>
#include <functional>

#include "tests/sharding/mlp.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/sharding/manager_state.h"

namespace zerort::testing {

constexpr int kGlobalBatch = 12;  // divisible by world sizes 1-4 and by micro-batch counts
constexpr float kLr = 0.01f;

struct RunConfig {
  ZeroStage stage = ZeroStage::k3;
  int world = 1;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  DType compute = DType::kF32;
  float clip = 0.0f;
  int micro_batches = 1;
  // When not empty: step s takes pattern[s % size] micro-batches (micro_batches is not used).
  std::vector<int> micro_batch_pattern;
  int steps = 20;
  int64_t persistence_threshold = 0;         // stage 3: every unit is gathered and released
  int64_t reduce_bucket_size = 500'000'000;  // elements; 1 reduces every unit alone
  Device device = Device::Cpu();             // CUDA: loopback ranks share one GPU
  bool overlap_comm = true;
  // [Note: the host step behind the forward]: on here, where kAuto leaves the synchronous CPU
  // device without it.
  HostStepOverlap overlap_host_step = HostStepOverlap::kOn;
  ShardPlacement placement;       // offload: optimizer state and (stage 3) parameters
  double offload_ratio = 1.0;     // offload_optimizer.ratio ([Note: partial optimizer offload])
  bool device_grad_sums = false;  // [Note: gradient sums on the device]
  std::string nvme_path;          // for kNvme placements
  IoEngine io_engine = IoEngine::kAuto;
  double predivide = 1.0;  // gradient_predivide_factor (prescale_gradients: the world size)
  bool allgather_partitions = true;
  bool reduce_scatter = true;
  int64_t max_reuse_distance = 0;               // stage3_max_reuse_distance
  int64_t max_live = 1'000'000'000;             // stage3_max_live_parameters
  int64_t prefetch = 50'000'000;                // stage3_prefetch_bucket_size
  int64_t allgather_bucket_size = 500'000'000;  // stages 1-2
  int64_t sub_group_size = 1'000'000'000;       // NVMe optimizer chunks; 0: one per shard
  // Hybrid sharding ([Note: hybrid sharding]): the state sharded over groups of this many
  // consecutive ranks, replicated across the groups; 0: over the whole world.
  int shard_size = 0;
  int hpz = 1;                    // ZeRO++ hpZ's secondary group size ([Note: hpZ]); 1: off
  int qgz_local = 0;              // ZeRO++ qgZ with nodes of this many ranks ([Note: qgZ]); 0: off
  bool qwz = false;               // ZeRO++ qwZ: int8 weight gathers
  int64_t freeze_step = 100'000;  // 1-bit Adam's and LAMB's last uncompressed step
  // 0/1 Adam's schedule ([Note: 0/1 Adam]): var_freeze_step, var_update_scaler,
  // local_step_scaler, local_step_clipper.
  int64_t zero_one[4] = {100'000, 16, 32'678, 16};
  // 1-bit LAMB's factor_max and factor_threshold ([Note: 1-bit LAMB]).
  float lamb_factor[2] = {4.0f, 0.1f};
  float weight_decay = 0.05f;  // on the MLP's weights
  // After this many steps every unit's master and moments are read and loaded back, as a
  // checkpoint load would (ShardManagerState); 0: never.
  int reload_after = 0;
  // Released weights filled with NaN and held from the next gather ([Note: poisoned buffers]):
  // on everywhere but where a test measures the gathered bytes, which the held buffers add to.
  bool poison = true;
};

inline ShardManagerOptions Options(const RunConfig& c) {
  ShardManagerOptions o;
  o.poison_released = c.poison;  // a read of released memory shows as NaN in every comparison
  o.stage = c.stage;
  o.compute_dtype = c.compute;
  o.reduce_dtype = c.compute == DType::kF32 ? DType::kF32 : c.compute;
  o.gradient_clipping = c.clip;
  o.stage3_param_persistence_threshold = c.persistence_threshold;
  o.reduce_bucket_size = c.reduce_bucket_size;
  o.overlap_comm = c.overlap_comm;
  o.overlap_host_step = c.overlap_host_step;
  o.gradient_predivide_factor = c.predivide;
  o.allgather_partitions = c.allgather_partitions;
  o.reduce_scatter = c.reduce_scatter;
  o.stage3_max_reuse_distance = c.max_reuse_distance;
  o.stage3_max_live_parameters = c.max_live;
  o.stage3_prefetch_bucket_size = c.prefetch;
  o.allgather_bucket_size = c.allgather_bucket_size;
  o.hpz_partition_size = c.hpz;
  o.quantized_weights = c.qwz;
  o.quantized_gradients = c.qgz_local > 0;
  o.optimizer.kind = c.optimizer;
  o.optimizer.freeze_step = c.freeze_step;
  o.optimizer.var_freeze_step = c.zero_one[0];
  o.optimizer.var_update_scaler = c.zero_one[1];
  o.optimizer.local_step_scaler = c.zero_one[2];
  o.optimizer.local_step_clipper = c.zero_one[3];
  o.optimizer.factor_max = c.lamb_factor[0];
  o.optimizer.factor_threshold = c.lamb_factor[1];
  o.placement = c.placement;
  o.offload.optimizer_ratio = c.offload_ratio;
  o.offload.device_grad_sums = c.device_grad_sums;
  o.offload.nvme_path = c.nvme_path;
  o.offload.aio_engine = std::string(IoEngineName(c.io_engine));
  o.offload.optimizer_buffer_count = 2;   // the smallest pipeline: every staging set reused
  o.offload.param_buffer_size = 1 << 16;  // elements: above the MLP's largest shard, not 1e8
  o.offload.sub_group_size = c.sub_group_size;
  o.optimizer.weight_decay = c.weight_decay;
  o.optimizer.beta2 = 0.95f;
  if (c.optimizer == OptimizerKind::kSgd) {
    o.optimizer.momentum = 0.9f;
    o.optimizer.nesterov = true;
  }
  return o;
}

struct RunResult {
  std::vector<std::vector<float>> params;  // full master values, gathered on rank 0
  int64_t gradient_collectives = 0;        // on rank 0
  int64_t gathered_peak = 0;               // rank 0: peak bytes of gathered weights
  int64_t comm_buffer_peak = 0;            // rank 0: peak bytes of communication buffers
  int64_t parameter_peak = 0;              // rank 0: peak device bytes of parameters
  int64_t secondary_bytes = 0;             // rank 0: the planned hpZ copies ([Note: hpZ])
  // Rank 0's all-gathers during the steps: over its shard group, and over the hpZ group.
  int64_t primary_gathers = 0, secondary_gathers = 0;
  std::vector<double> grad_norms;
  std::vector<bool> skipped;
  // Rank 0's host-tier gradient shards the norm read again ([Note: the norm taken by the last
  // add]), after each step.
  std::vector<int64_t> norm_passes;
  std::string error;
};

// A manager on `comm` with the MLP's units registered and initialised.
struct MlpRun {
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<ShardManager> manager;
  std::vector<int> units;
};

inline StatusOr<MlpRun> MakeMlpRun(const ShardManagerOptions& options, Communicator& comm,
                                   MemoryTracker& tracker, Device device = Device::Cpu(),
                                   const std::function<UnitOptions(int layer)>& unit_options = {},
                                   const ShardManager::Resources& groups = {}) {
  MlpRun run;
  if (device.is_cuda()) {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device));
    ZR_ASSIGN_OR_RETURN(run.allocator, MakeCudaCachingAllocator(device, &tracker));
  } else {
    run.allocator = MakeCpuCachingAllocator(&tracker);
  }
  ZR_ASSIGN_OR_RETURN(run.manager,
                      ShardManager::Create(options, {.dp = &comm,
                                                     .replicate = groups.replicate,
                                                     .secondary = groups.secondary,
                                                     .grad_intra = groups.grad_intra,
                                                     .grad_inter = groups.grad_inter,
                                                     .device_allocator = run.allocator.get(),
                                                     .tracker = &tracker}));
  for (int l = 0; l < MlpLayers(); ++l) {
    ZR_ASSIGN_OR_RETURN(int u,
                        run.manager->AddUnit("fc" + std::to_string(l), MlpUnitParams(l),
                                             unit_options ? unit_options(l) : UnitOptions{}));
    run.units.push_back(u);
  }
  ZR_RETURN_IF_ERROR(run.manager->Initialize(MlpInit));
  return run;
}

// One rank's part of a training run of the MLP through the shard manager; rank 0 fills `result`.
inline Status TrainRank(const RunConfig& c, Communicator& comm, RunResult& result) {
  MemoryTracker tracker;
  // Hybrid sharding: the manager shards over `shard` and reduces across `replicate`.
  std::unique_ptr<Communicator> shard, replicate;
  if (c.shard_size > 0 && c.shard_size < comm.size()) {
    CommOptions o = comm.options();
    o.name = "shard";
    ZR_ASSIGN_OR_RETURN(shard, comm.Split(comm.rank() / c.shard_size, comm.rank(), o));
    o.name = "replicate";
    ZR_ASSIGN_OR_RETURN(replicate, comm.Split(comm.rank() % c.shard_size, comm.rank(), o));
  }
  Communicator& group = shard ? *shard : comm;
  std::unique_ptr<Communicator> secondary;  // hpZ: consecutive ranks of the shard group
  if (c.hpz > 1) {
    CommOptions o = comm.options();
    o.name = "hpz";
    ZR_ASSIGN_OR_RETURN(secondary, group.Split(group.rank() / c.hpz, group.rank(), o));
  }
  std::unique_ptr<Communicator> intra, inter;  // qgZ: nodes of qgz_local consecutive ranks
  if (c.qgz_local > 0) {
    CommOptions o = comm.options();
    o.name = "intra";
    ZR_ASSIGN_OR_RETURN(intra, group.Split(group.rank() / c.qgz_local, group.rank(), o));
    o.name = "inter";
    ZR_ASSIGN_OR_RETURN(inter, group.Split(group.rank() % c.qgz_local, group.rank(), o));
  }
  ZR_ASSIGN_OR_RETURN(
      MlpRun run, MakeMlpRun(Options(c), group, tracker, c.device, {},
                             {.replicate = replicate.get(),
                              .secondary = secondary.get(),
                              .grad_intra = intra.get(),
                              .grad_inter = inter && inter->size() > 1 ? inter.get() : nullptr}));
  tracker.ResetPeaks();  // the steps' peaks, not setup's (Initialize's unit agreement stages 8 B)
  ShardManager* m = run.manager.get();
  // The steps' all-gathers, by group (rank 0).
  auto gathers = std::make_shared<const CollectiveSpanSink>([&](const CollectiveSpan& span) {
    if (span.op != CollectiveOp::kAllGather || comm.rank() != 0) return;
    ++(span.group == "hpz" ? result.secondary_gathers : result.primary_gathers);
  });
  group.recorder().SetSpanSink(gathers);
  if (secondary) secondary->recorder().SetSpanSink(gathers);
  const std::vector<int>& units = run.units;
  const int per_rank = kGlobalBatch / c.world;
  for (int step = 0; step < c.steps; ++step) {
    const int micro_batches =
        c.micro_batch_pattern.empty()
            ? c.micro_batches
            : c.micro_batch_pattern[static_cast<size_t>(step) % c.micro_batch_pattern.size()];
    const int per_micro = per_rank / micro_batches;
    for (int k = 0; k < micro_batches; ++k) {
      const int64_t first = int64_t{step} * kGlobalBatch + comm.rank() * per_rank + k * per_micro;
      ZR_RETURN_IF_ERROR(MlpForwardBackward(*m, units, first, per_micro, m->loss_scale()).status());
    }
    ZR_ASSIGN_OR_RETURN(StepResult r, m->Step({.lr = kLr, .micro_batches = micro_batches}));
    if (comm.rank() == 0) {
      result.grad_norms.push_back(r.grad_norm);
      result.skipped.push_back(r.skipped);
      result.norm_passes.push_back(m->offload_stats().norm_passes);
    }
    if (step + 1 == c.reload_after) {
      ShardManagerState state(*m);
      for (int u : units) {
        for (StateKind kind : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq,
                               StateKind::kExpAvgSqFresh}) {
          if (!m->optimizer().HasState(kind)) continue;
          std::vector<float> values(m->unit(u).layout().shard_numel());
          ZR_RETURN_IF_ERROR(state.ReadState(u, kind, values));
          ZR_RETURN_IF_ERROR(state.LoadState(u, kind, values));
        }
      }
      ZR_RETURN_IF_ERROR(state.RefreshComputeCopies());
    }
  }
  group.recorder().SetSpanSink(nullptr);
  if (secondary) secondary->recorder().SetSpanSink(nullptr);
  if (comm.rank() == 0) {
    result.parameter_peak = tracker.Usage(MemoryTier::kDevice, MemoryCategory::kParameters).peak;
    for (int u : units) {
      const PlannedBuffer* b = m->unit(u).plan().Find(UnitBuffer::kSecondary);
      result.secondary_bytes += b != nullptr ? b->bytes() : 0;
    }
    result.gradient_collectives = m->gradient_collectives();
    result.gathered_peak =
        tracker.Usage(MemoryTier::kDevice, MemoryCategory::kGatheredWeights).peak;
    result.comm_buffer_peak = tracker.Usage(MemoryTier::kDevice, MemoryCategory::kCommBuffers).peak;
  }
  for (int u : units) {
    for (size_t i = 0; i < m->unit(u).layout().params().size(); ++i) {
      std::vector<float> full(m->unit(u).layout().params()[i].numel());
      ZR_RETURN_IF_ERROR(ShardManagerState(*m).GatherMaster(u, static_cast<int>(i), full));
      if (comm.rank() == 0) result.params.push_back(std::move(full));
    }
  }
  return absl::OkStatus();
}

// The same run on `c.world` loopback ranks.
inline RunResult Train(const RunConfig& c) {
  RunResult result;
  CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(60);
  const Status status = RunLoopbackRanks(c.world, comm_options, nullptr, [&](Communicator& comm) {
    return TrainRank(c, comm, result);
  });
  if (!status.ok()) result.error = status.ToString();
  return result;
}

inline MlpReference Reference(const RunConfig& c, std::vector<double>* norms) {
  MlpReference ref(Options(c).seed);
  const ShardManagerOptions o = Options(c);
  for (int step = 0; step < c.steps; ++step) {
    ref.Backward(int64_t{step} * kGlobalBatch, kGlobalBatch);
    const double norm = ref.GradNorm(1.0f);
    if (norms != nullptr) norms->push_back(norm);
    const double clip = c.clip > 0 ? std::min(1.0, c.clip / (norm + 1e-6)) : 1.0;
    ref.Step(o, kLr, static_cast<float>(clip));
  }
  return ref;
}

// Largest norm-wise relative error ||a - b|| / ||b|| over the parameter tensors.
inline double MaxRelativeError(const std::vector<std::vector<float>>& a,
                               const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t k = 0; k < b.size(); ++k) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < b[k].size(); ++i) {
      const double d = static_cast<double>(a[k][i]) - b[k][i];
      diff += d * d;
      norm += static_cast<double>(b[k][i]) * b[k][i];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

}  // namespace zerort::testing
