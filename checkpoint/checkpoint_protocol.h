// The checkpoint protocol's shared pieces (internal to checkpoint/): the state kinds a checkpoint
// holds and the agreement every phase of a save or a load ends with.
#pragma once

#include <string_view>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {

struct CheckpointKind {
  StateKind buffer;
  const char* name;
};
inline constexpr CheckpointKind kKinds[] = {{StateKind::kMaster, "master"},
                                            {StateKind::kExpAvg, "exp_avg"},
                                            {StateKind::kExpAvgSq, "exp_avg_sq"},
                                            {StateKind::kExpAvgSqFresh, "exp_avg_sq_fresh"}};
inline constexpr int kNumKinds = 4;

// Every rank of `group` learns whether every rank succeeded, and gets the first failing rank's
// message (so the error names the damaged file on every rank, not only where it was read).
Status AgreeOnCheckpoint(ShardManager& m, Communicator& group, const Status& local,
                         std::string_view what);

}  // namespace zerort
