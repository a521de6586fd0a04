// The runtime's options from a run config, built in one place: `zerort train` (engine/trainer.cc)
// and the memory estimator (MemoryModelInput::FromConfig) both call these, so what the estimator
// replays is the shard manager the run creates. A knob that reaches the shard manager is a field
// table row (config/config_rows.cc), its RunConfig member (whose default is the option's,
// RuntimeDefaults() in config.h) and one line here.
#pragma once

#include <string>

#include "zerort/config/config.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/memory.h"
#include "zerort/sharding/options.h"

namespace zerort {

// bf16.enabled -> bf16, fp16.enabled -> f16 (with the manager's dynamic loss scaler), else f32.
DType ComputeDType(const RunConfig& c);

// Where an offload section puts its buffers: the device, pinned or plain host memory, or NVMe.
MemoryTier OffloadTier(const OffloadConfig& o);

// Test-only faults, read by the CLI from the environment (ZERORT_FAIL_NVME_REQUEST,
// ZERORT_FAIL_NVME_ERRNO, ZERORT_FAIL_PIPELINE_SEND) and passed down; never a config key.
struct FaultHooks {
  int64_t nvme_request = 0;  // the k-th NVMe request fails (0: never)
  int nvme_errno = RuntimeDefaults().offload.fail_io_errno;  // with this errno (EIO)
  int pipeline_send_stage = -1;     // this pipeline stage skips its sends (-1: none)
  bool pipeline_send_dies = false;  // ... or its process dies instead
  static FaultHooks FromEnvironment();
};

// How the run's streams execute on the CPU: train.device "cpu-async" queues each on a thread of
// its own (with train.async_jitter_seed's delays); otherwise immediate.
StreamOptions StreamOptionsFrom(const RunConfig& c);

// The shard manager's options for a run of `c` whose data-parallel group has `dp_size` ranks
// (prescale_gradients divides by it before the reduction); a pipeline (pipeline_parallel_size > 1)
// reduces once per step. `faults` only in tests.
ShardManagerOptions ShardManagerOptionsFrom(const RunConfig& c, int dp_size,
                                            const FaultHooks& faults = {});

}  // namespace zerort
