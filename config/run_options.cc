// RunConfig -> the runtime's options (run_options.h).
#include "zerort/config/run_options.h"

#include <cstdlib>

namespace zerort {

DType ComputeDType(const RunConfig& c) {
  if (c.bf16) return DType::kBF16;
  if (c.fp16.enabled) return DType::kF16;
  return DType::kF32;
}

MemoryTier OffloadTier(const OffloadConfig& o) {
  if (o.device == "nvme") return MemoryTier::kNvme;
  if (o.device == "cpu") return o.pin_memory ? MemoryTier::kPinnedHost : MemoryTier::kHost;
  return MemoryTier::kDevice;
}

FaultHooks FaultHooks::FromEnvironment() {
  FaultHooks f;
  if (const char* k = std::getenv("ZERORT_FAIL_NVME_REQUEST")) f.nvme_request = std::atoll(k);
  if (const char* e = std::getenv("ZERORT_FAIL_NVME_ERRNO")) f.nvme_errno = std::atoi(e);
  // "<stage>:skip" or "<stage>:die"
  if (const char* p = std::getenv("ZERORT_FAIL_PIPELINE_SEND")) {
    const std::string fault = p;
    f.pipeline_send_stage = std::atoi(fault.c_str());
    f.pipeline_send_dies = fault.ends_with(":die");
  }
  return f;
}

StreamOptions StreamOptionsFrom(const RunConfig& c) {
  StreamOptions s;
  if (c.train.device == "cpu-async") {
    s.cpu = CpuExecution::kQueued;
    s.jitter_seed = static_cast<uint64_t>(c.train.async_jitter_seed);
    s.jitter_max_us = c.train.async_jitter_max_us;
  }
  return s;
}

ShardManagerOptions ShardManagerOptionsFrom(const RunConfig& c, int dp_size,
                                            const FaultHooks& faults) {
  ShardManagerOptions o;
  o.streams = StreamOptionsFrom(c);
  o.stage = static_cast<ZeroStage>(c.zero.stage);
  o.compute_dtype = ComputeDType(c);
  o.reduce_dtype = DType::kF32;
  o.gradient_clipping = c.gradient_clipping;
  // DeepSpeed's prescale_gradients: the whole division before the reduction.
  o.gradient_predivide_factor = c.prescale_gradients ? dp_size : c.gradient_predivide_factor;
  o.overlap_comm = c.zero.overlap_comm;
  o.allgather_partitions = c.zero.allgather_partitions;
  o.reduce_scatter = c.zero.reduce_scatter;
  o.reduce_at_step = c.parallel.pipeline_parallel_size > 1;  // one reduction per step
  o.reduce_bucket_size = c.zero.reduce_bucket_size;
  o.stage3_prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  o.stage3_max_live_parameters = c.zero.stage3_max_live_parameters;
  o.stage3_max_reuse_distance = c.zero.stage3_max_reuse_distance;
  o.allgather_bucket_size = c.zero.allgather_bucket_size;
  o.stage3_param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  o.hpz_partition_size = c.zero.zero_hpz_partition_size;
  o.quantized_weights = c.zero.zero_quantized_weights;
  o.quantized_gradients = c.zero.zero_quantized_gradients;
  o.seed = c.seed;
  // Offload (DeepSpeed's offload_optimizer / offload_param / aio): a placement of the buffers.
  o.placement.optimizer = OffloadTier(c.zero.offload_optimizer);
  o.placement.params = OffloadTier(c.zero.offload_param);
  OffloadOptions& off = o.offload;
  off.nvme_path = c.zero.offload_optimizer.nvme_path.empty() ? c.zero.offload_param.nvme_path
                                                             : c.zero.offload_optimizer.nvme_path;
  off.optimizer_buffer_count = c.zero.offload_optimizer.buffer_count;
  off.param_buffer_count = c.zero.offload_param.buffer_count;
  off.param_buffer_size = c.zero.offload_param.buffer_size;
  off.sub_group_size = c.zero.sub_group_size;
  off.aio_block_size = c.aio.block_size;
  off.aio_queue_depth = c.aio.queue_depth;
  off.aio_thread_count = c.aio.thread_count;
  off.aio_single_submit = c.aio.single_submit;
  off.aio_overlap_events = c.aio.overlap_events;
  off.aio_engine = c.aio.engine;
  off.fail_io_request = faults.nvme_request;
  off.fail_io_errno = faults.nvme_errno;
  const OptimizerConfig& opt = c.optimizer;
  if (opt.type == "SGD") {
    o.optimizer.kind = OptimizerKind::kSgd;
  } else if (opt.type == "Lamb") {
    o.optimizer.kind = OptimizerKind::kLamb;
  } else if (opt.type == "OneBitAdam") {
    o.optimizer.kind = OptimizerKind::kOneBitAdam;
  } else if (opt.type == "ZeroOneAdam") {
    o.optimizer.kind = OptimizerKind::kZeroOneAdam;
  } else if (opt.type == "OneBitLamb") {
    o.optimizer.kind = OptimizerKind::kOneBitLamb;
  } else if (opt.type == "Adam" && !opt.adam_w_mode) {
    o.optimizer.kind = OptimizerKind::kAdam;
  } else {
    o.optimizer.kind = OptimizerKind::kAdamW;  // AdamW, and DeepSpeed's Adam in adam_w_mode
  }
  o.optimizer.beta1 = opt.betas[0];
  o.optimizer.beta2 = opt.betas[1];
  o.optimizer.eps = opt.eps;
  o.optimizer.bias_correction = opt.bias_correction;
  o.optimizer.max_coeff = opt.max_coeff;
  o.optimizer.min_coeff = opt.min_coeff;
  o.optimizer.freeze_step = opt.freeze_step;
  o.optimizer.var_freeze_step = opt.var_freeze_step;
  o.optimizer.var_update_scaler = opt.var_update_scaler;
  o.optimizer.local_step_scaler = opt.local_step_scaler;
  o.optimizer.local_step_clipper = opt.local_step_clipper;
  o.optimizer.coeff_beta = opt.coeff_beta;
  o.optimizer.factor_max = opt.factor_max;
  o.optimizer.factor_min = opt.factor_min;
  o.optimizer.factor_threshold = opt.factor_threshold;
  o.optimizer.weight_decay = opt.weight_decay;
  o.optimizer.momentum = opt.momentum;
  o.optimizer.dampening = opt.dampening;
  o.optimizer.nesterov = opt.nesterov;
  o.loss_scale.dynamic = c.fp16.loss_scale == 0.0f;
  o.loss_scale.static_scale = c.fp16.loss_scale == 0.0f ? 1.0f : c.fp16.loss_scale;
  o.loss_scale.initial_scale_power = c.fp16.initial_scale_power;
  o.loss_scale.loss_scale_window = c.fp16.loss_scale_window;
  o.loss_scale.hysteresis = c.fp16.hysteresis;
  o.loss_scale.min_loss_scale = c.fp16.min_loss_scale;
  o.loss_scale.max_consecutive_skips = c.fp16.max_consecutive_skips;
  return o;
}

}  // namespace zerort
