// Options of the shard manager, named after DeepSpeed's config keys where DeepSpeed has one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/memory.h"

namespace zerort {

enum class ZeroStage : int { k0 = 0, k1 = 1, k2 = 2, k3 = 3 };

// kOneBitAdam: DeepSpeed's OnebitAdam, stage 0 only ([Note: 1-bit Adam],
// sharding/compressed_allreduce.h).
// kZeroOneAdam: DeepSpeed's 0/1 Adam, stage 0 only ([Note: 0/1 Adam]).
// kOneBitLamb: DeepSpeed's OnebitLamb, stage 0 only ([Note: 1-bit LAMB]).
enum class OptimizerKind { kAdamW, kAdam, kSgd, kLamb, kOneBitAdam, kZeroOneAdam, kOneBitLamb };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float beta1 = 0.9f;           // Adam(W) "betas"[0]
  float beta2 = 0.999f;         // Adam(W) "betas"[1]
  float eps = 1e-8f;            // Adam(W)
  bool bias_correction = true;  // Adam(W): DeepSpeed's bias_correction
  float weight_decay = 0.0f;    // applied only to parameters whose ParamSpec says so
  float momentum = 0.0f;        // SGD
  float dampening = 0.0f;       // SGD
  bool nesterov = false;        // SGD
  float max_coeff = 10.0f;      // LAMB: the trust ratio's clamp (DeepSpeed's defaults)
  float min_coeff = 0.01f;
  // 1-bit Adam and 1-bit LAMB: the last uncompressed step (DeepSpeed's default).
  int64_t freeze_step = 100'000;
  // 1-bit LAMB (DeepSpeed's defaults): the frozen trust ratio's running-average coefficient, and
  // the bounds of the factor that scales it after freeze_step, and of its change per step.
  float coeff_beta = 0.9f;
  float factor_max = 4.0f;
  float factor_min = 0.5f;
  float factor_threshold = 0.1f;
  // 0/1 Adam (DeepSpeed's defaults): the variance's last update, the updates per doubling of
  // its interval, and after the freeze the steps per doubling of the local-step interval and its
  // cap ([Note: 0/1 Adam]).
  int64_t var_freeze_step = 100'000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32'678;
  int64_t local_step_clipper = 16;
};

// 1-bit Adam's and 1-bit LAMB's phase for step `step` (1-based): compressed after
// max(freeze_step, 2), as DeepSpeed's OnebitAdam and OnebitLamb switch after their initialisation
// step ([Note: 1-bit Adam]).
inline bool OneBitCompressing(const OptimizerOptions& o, int64_t step) {
  return (o.kind == OptimizerKind::kOneBitAdam || o.kind == OptimizerKind::kOneBitLamb) &&
         step > std::max<int64_t>(o.freeze_step, 2);
}

// fp16 dynamic loss scaling, DeepSpeed's "fp16" section. Unused for fp32/bf16 (scale 1).
struct LossScaleOptions {
  bool dynamic = true;           // "loss_scale": 0 means dynamic in DeepSpeed
  float static_scale = 1.0f;     // "loss_scale" when not dynamic
  int initial_scale_power = 16;  // initial scale 2^16
  int loss_scale_window = 1000;  // overflow-free steps before the scale doubles
  int hysteresis = 2;            // overflows tolerated before the scale halves
  float min_loss_scale = 1.0f;
  int max_consecutive_skips = 50;  // then the run stops with a clear error (zerort's own)
};

// Where the shard buffers live. Offload is a placement, not another code path: UnitPlan gives
// every buffer its tier from here.
//   optimizer: fp32 master, moments and gradient shard (DeepSpeed's offload_optimizer): kDevice,
//              kPinnedHost or kHost (device "cpu", pinned or not), or kNvme; the optimizer step
//              runs on the CPU when they are not on the device.
//   params:    the stage-3 compute shard (DeepSpeed's offload_param), fetched before each gather.
struct ShardPlacement {
  MemoryTier optimizer = MemoryTier::kDevice;
  MemoryTier params = MemoryTier::kDevice;
};

// The offload tier's knobs (DeepSpeed's offload_* buffer keys and its "aio" section).
struct OffloadOptions {
  std::string nvme_path;           // directory of this rank's NVMe file (kNvme placements)
  int optimizer_buffer_count = 4;  // offload_optimizer.buffer_count: chunks in flight (>= 2)
  int param_buffer_count = 5;      // offload_param.buffer_count: parameter fetches in flight
  int64_t param_buffer_size = 100'000'000;  // offload_param.buffer_size: elements per fetch
  int64_t sub_group_size = 1'000'000'000;   // elements per optimizer chunk (DeepSpeed's key); 0:
                                            // one chunk per unit's shard
  // offload_optimizer.ratio ([Note: partial optimizer offload]): the share of the units whose
  // optimizer state a host placement takes; the others keep theirs on the device. 1: all.
  double optimizer_ratio = 1.0;
  // [Note: gradient sums on the device]
  // With the optimizer state on the host (kHost or kPinnedHost), each micro-batch's reduced
  // gradient slice (fp32: reduce_dtype) goes to the host and is added into the unit's fp32
  // gradient shard there, as DeepSpeed's ZeRO-Offload does: 4 bytes a parameter over the link
  // and 12 through host memory every micro-batch, which on a GPU can take the host longer than
  // the micro-batch takes the device (docs/gpu.md, "The gradient slices are fp32"). With this
  // on, a host-tier unit's gradient shard lives on the device instead (planned there:
  // PlanUnit), the slices are added into it by the device's kernels, the global norm is taken
  // there, and the step copies each unit's sum to the host once (pinned staging) right before
  // the CPU updates that unit, then zeroes it on the device; behind the forward on a stream of
  // their own ("grad sums", after an event the step records on the compute stream), so that the
  // next forward's kernels do not queue behind the copies. The same float additions in the
  // same order (an fp32 add is the same on every device), so the same numbers as the host's
  // sums and as the device-only run; 4 bytes a parameter of the rank's shard more on the device,
  // 4 less on the host. Host tiers only: NVMe's gradient shards stream to its file (the config
  // refuses the pair), and the 1-bit optimizers keep their state on the device.
  bool device_grad_sums = false;
  int64_t aio_block_size = 1 << 20;  // aio.block_size: bytes per I/O request
  int aio_queue_depth = 8;           // aio.queue_depth
  int aio_thread_count = 1;          // aio.thread_count: pread/pwrite engine threads
  bool aio_single_submit = false;    // aio.single_submit
  bool aio_overlap_events = true;    // aio.overlap_events
  std::string aio_engine = "auto";   // auto | io_uring | threads (zerort's own key)
  int64_t fail_io_request = 0;       // test hook: the k-th NVMe request fails (0: never)
  int fail_io_errno = 5;             // with this errno (EIO)
};

enum class HostStepOverlap { kAuto, kOn, kOff };

struct ShardManagerOptions {
  ZeroStage stage = ZeroStage::k3;
  DType compute_dtype = DType::kF32;  // gathered weights and activations
  DType reduce_dtype = DType::kF32;   // full gradients and their reduction
  OptimizerOptions optimizer;
  ShardPlacement placement;
  OffloadOptions offload;
  LossScaleOptions loss_scale;     // used when compute_dtype is f16
  float gradient_clipping = 0.0f;  // max global L2 norm; 0 disables
  // Where the data-parallel mean divides (DeepSpeed's gradient_predivide_factor; prescale_gradients
  // is the factor dp_size): gradients are divided by this before the reduction (a sum) and by
  // (dp_size / factor) after. 1 (default): the sum, then the mean, as DeepSpeed does by default.
  double gradient_predivide_factor = 1.0;
  bool overlap_comm = true;  // reduce gradients on the comm stream, overlapping backward compute
  // A host-tier AdamW, Adam or SGD step runs on a worker thread, each unit completed when the
  // next forward first needs it ([Note: the host step behind the forward], sharded_optimizer.h).
  // The same numbers either way; kAuto: where the compute stream is asynchronous (a GPU, or
  // cpu-async), not on the synchronous CPU device, whose forward runs on the cores the update
  // would take.
  HostStepOverlap overlap_host_step = HostStepOverlap::kAuto;
  // DeepSpeed's allgather_partitions: false gathers a unit's shards by one broadcast per rank
  // instead of one all-gather (the same bytes, more collectives).
  bool allgather_partitions = true;
  // DeepSpeed's reduce_scatter: false reduces stage 2-3 gradients by an all-reduce of the full
  // gradients, each rank keeping its shard (the same numbers, more bytes moved).
  bool reduce_scatter = true;
  // Stages 2-3: keep each unit's full gradient through the step's micro-batches and reduce it
  // once, at the step, instead of as each backward ends (a pipeline's micro-batches: m-fold
  // fewer gradient collectives for every unit's full gradient held through the step).
  bool reduce_at_step = false;
  int64_t reduce_bucket_size = 500'000'000;            // elements (DeepSpeed's default)
  int64_t stage3_prefetch_bucket_size = 50'000'000;    // elements issued ahead
  int64_t stage3_max_live_parameters = 1'000'000'000;  // elements gathered at once
  // Stage 3: a unit used again within the step after fewer than this many elements of other
  // units stays gathered instead of being released and gathered again (sharding/reuse_distance.h;
  // within stage3_max_live_parameters). 0 (zerort's default): release after every use.
  // DeepSpeed's default is 1e9, which keeps every block gathered from its forward to its backward.
  int64_t stage3_max_reuse_distance = 0;
  // Stages 1-2: the updated parameters are all-gathered after the step in collectives of at most
  // this many elements (world x piece), through a staging buffer of that size when a unit is
  // larger (DeepSpeed's allgather_bucket_size); a unit that fits is gathered in place.
  int64_t allgather_bucket_size = 500'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;  // smaller units stay gathered
  // ZeRO++ hpZ (DeepSpeed's zero_hpz_partition_size), stage 3: a unit's first gather of a step
  // also keeps its weights sharded over groups of this many ranks (Resources::secondary, within
  // a node), and its later gathers in the step read that copy ([Note: hpZ], sharded_unit.h).
  // 1: off.
  int hpz_partition_size = 1;
  // ZeRO++ qwZ (DeepSpeed's zero_quantized_weights), stage 3: a non-persistent unit's primary
  // gather sends its shards block-quantized to int8 with fp32 scales ([Note: block quantization],
  // kernels/quantize.h) and every rank dequantizes the same bytes: the weights the model reads
  // differ from the master's compute copy by the quantization, alike on every rank.
  bool quantized_weights = false;
  // ZeRO++ qgZ (DeepSpeed's zero_quantized_gradients), stage 3: the gradient reduce-scatter sent
  // as int8 in two all-to-all levels, inside the node then across ([Note: qgZ],
  // quantized_reduce.h; Resources::grad_intra and grad_inter).
  bool quantized_gradients = false;
  int64_t alignment = 16;  // elements; see FlatLayout
  uint64_t seed = 1234;    // passed to initialisers
  // Debug: memory a unit stops using (a stage-3 unit's gathered weights when it is released, a
  // stage 2-3 full gradient after its reduction) is filled with 0xFF bytes, a NaN in f32, bf16 and
  // f16, before it goes back to the allocator, so that a read through a pointer kept past its
  // scope's End() gives NaN instead of plausible stale numbers. Costs a fill of every released
  // buffer. (Views a scope hands out are checked after End() either way: [Note: view leases].)
  bool poison_released = false;
  // How the streams the manager creates (compute and comm, when Resources gives none) run on the
  // CPU: immediate, or queued for the asynchronous CPU device ([Note: the asynchronous CPU
  // device]). CUDA streams ignore it.
  StreamOptions streams;
};

// ShardManagerOptions::poison_released's fill: every byte 0xFF, a NaN in each floating-point dtype.
inline constexpr uint8_t kPoisonByte = 0xFF;

// [Note: partial optimizer offload]
// DeepSpeed's ZeRO-Offload++ "Twin-Flow" (offload_optimizer.ratio): with the optimizer placed on
// the host, only the last units, a share `ratio` of them, keep their master, moments and gradient
// shard there and are updated by the CPU; the first ones keep theirs on the device and are
// updated by its kernels. DeepSpeed's rule over its optimizer sub-groups, applied to a rank's
// units in registration order: unit i of n is on the host when i >= floor((1 - ratio) * n),
// rounded as exact arithmetic would (DeepSpeed's float product puts (1 - 0.9) * 10 just under 1,
// and one more sub-group on the host). The last units: the next forward reaches them last, so the
// host has the most time to update them behind it ([Note: the host step behind the forward]),
// and the step's host bytes shrink by the ratio. The arithmetic is every unit's own either way:
// the same numbers as all on one tier (the global norm adds the units' parts in unit order on
// both). A pure function of the options and the unit count: UnitPlan's caller (ShardManager,
// the memory model) gives each unit its tier. Not with NVMe (its pipelined step covers every
// unit) or the 1-bit optimizers (state of the whole rank): the config refuses those.
inline int DeviceOptimizerUnits(const ShardManagerOptions& o, int units) {
  const MemoryTier t = o.placement.optimizer;
  if (t != MemoryTier::kPinnedHost && t != MemoryTier::kHost) {
    return t == MemoryTier::kDevice ? units : 0;
  }
  const double r = std::clamp(o.offload.optimizer_ratio, 0.0, 1.0);
  return std::clamp(static_cast<int>(std::floor((1.0 - r) * units + 1e-9)), 0, units);
}
inline MemoryTier UnitOptimizerTier(const ShardManagerOptions& o, int unit, int units) {
  return unit < DeviceOptimizerUnits(o, units) ? MemoryTier::kDevice : o.placement.optimizer;
}

// Whether a step of these options over `units` units runs behind the next forward ([Note: the
// host step behind the forward]): some unit's optimizer on a host tier in memory (not NVMe),
// AdamW, Adam or SGD (no collective inside the update), and overlap_host_step on, or kAuto with
// an asynchronous compute stream. The device-tier units of a partial offload are updated by the
// step itself. ShardedOptimizer and the memory model (estimate/step_model.cc) both ask this.
inline bool DefersHostStep(const ShardManagerOptions& o, bool asynchronous_compute, int units) {
  const OptimizerKind k = o.optimizer.kind;
  return (k == OptimizerKind::kAdamW || k == OptimizerKind::kAdam || k == OptimizerKind::kSgd) &&
         (o.placement.optimizer == MemoryTier::kPinnedHost ||
          o.placement.optimizer == MemoryTier::kHost) &&
         DeviceOptimizerUnits(o, units) < units &&
         (o.overlap_host_step == HostStepOverlap::kOn ||
          (o.overlap_host_step == HostStepOverlap::kAuto && asynchronous_compute));
}

}  // namespace zerort
