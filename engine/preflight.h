// Preflight checks of a run, before it allocates or trains (docs/design.md, "Untrusted input"):
// the paths the config names are usable on this rank's machine, the ranks' configs agree, a
// resumed checkpoint's shaping config matches, and the memory estimator's peak fits the machine.
// Reading a config touches no file (config/config.h); `zerort train` runs CheckRunPaths once per
// rank after reading it, and `zerort estimate` never does (a cluster's config is estimated on a
// laptop that lacks its nvme_path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/config/config.h"
#include "zerort/engine/host_memory.h"
#include "zerort/estimate/memory_model.h"
#include "zerort/runtime/status.h"

namespace zerort {

// The paths of `c` on this machine, every problem named under `file`: each NVMe store's directory
// exists and takes a new file (one is created and removed at once), data.path is a readable regular
// file, and checkpoint.dir and csv_monitor's directory (when enabled) are writable or can be
// created (a directory is made and removed in their nearest existing ancestor; nothing is left
// behind).
Status CheckRunPaths(const RunConfig& c, const std::string& file);

// Every rank's resolved config (JSON text), gathered; `me` is this rank. Ok when all are equal;
// else InvalidArgument naming the first differing key and both values (this rank's against rank
// 0's, or when it agrees with rank 0, against the first rank that does not).
Status CompareRankConfigs(const std::vector<std::string>& configs, int me);

// What a rank may use: its GPU's memory (cuda), or its node's host memory shared by the node's
// ranks.
struct MachineMemory {
  bool cuda = false;
  int ranks_on_node = 1;
  int world_size = 1;     // for the message's estimate command
  int64_t gpu_bytes = 0;  // 0: unknown
  HostMemory host;
};
// The estimator's reserved peak for `in` (one rank, its pipeline stage) against `machine`: Ok when
// it fits; else InvalidArgument with the per-category estimate, its largest term and the ZeRO
// stage x activation checkpointing layouts that would fit.
Status CheckMemoryFits(const MemoryModelInput& in, const MachineMemory& machine);

}  // namespace zerort
