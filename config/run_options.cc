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
  // [Note: a key is its option] (config.h): the members the keys bind come as they are; what
  // follows are the mappings.
  ShardManagerOptions o = c.manager;
  o.streams = StreamOptionsFrom(c);
  o.stage = static_cast<ZeroStage>(c.zero.stage);
  o.compute_dtype = ComputeDType(c);
  o.reduce_dtype = DType::kF32;
  // DeepSpeed's prescale_gradients: the whole division before the reduction.
  o.gradient_predivide_factor = c.prescale_gradients ? dp_size : c.gradient_predivide_factor;
  o.reduce_at_step = c.parallel.pipeline_parallel_size > 1;  // one reduction per step
  o.seed = c.seed;
  if (!c.train.overlap_host_step) o.overlap_host_step = HostStepOverlap::kOff;
  o.offload.device_grad_sums = c.train.device_grad_sums;
  // Offload (DeepSpeed's offload_optimizer / offload_param): a placement of the buffers, the
  // NVMe directory either section names, and each section's buffer counts.
  o.placement.optimizer = OffloadTier(c.zero.offload_optimizer);
  o.placement.params = OffloadTier(c.zero.offload_param);
  OffloadOptions& off = o.offload;
  off.nvme_path = c.zero.offload_optimizer.nvme_path.empty() ? c.zero.offload_param.nvme_path
                                                             : c.zero.offload_optimizer.nvme_path;
  off.optimizer_buffer_count = c.zero.offload_optimizer.buffer_count;
  off.optimizer_ratio = c.zero.offload_optimizer.ratio;
  off.param_buffer_count = c.zero.offload_param.buffer_count;
  off.param_buffer_size = c.zero.offload_param.buffer_size;
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
  o.loss_scale.dynamic = c.fp16.loss_scale == 0.0f;
  o.loss_scale.static_scale = c.fp16.loss_scale == 0.0f ? 1.0f : c.fp16.loss_scale;
  return o;
}

}  // namespace zerort
