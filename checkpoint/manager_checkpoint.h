// ManagerCheckpoints: checkpoints for a trainer that embeds the shard manager (docs/embedding.md).
// A directory of step_<N> checkpoints of the manager's state (fp32 masters, optimizer moments,
// step counters, the loss scaler) with the trainer's own step and JSON, and no model config. They
// are zerort train's checkpoints (checkpoint/checkpoint.h: the same files, atomic commit,
// checksums, `latest`, rotation of this trainer's own steps only) with `config` null and `user` the
// trainer's JSON, so they load at any world size and ZeRO stage, and `zerort checkpoint inspect`
// reads them.
//
//   zerort::ManagerCheckpoints checkpoints("ckpt", *manager, {.keep_last_n = 2});
//   ZR_ASSIGN_OR_RETURN(std::optional<zerort::TrainerState> resumed, checkpoints.LoadLatest());
//   int64_t step = resumed ? resumed->step : 0;
//   ... train ...
//   ZR_RETURN_IF_ERROR(checkpoints.Save({.step = step, .user = {{"data_offset", offset}}}));
//
// Every call is collective over the world (by default the manager's data-parallel group), after
// Initialize. Loading matches parameters by name and shape: the trainer must have added the same
// parameters (any unit split, world size, stage or placement).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "zerort/checkpoint/checkpoint.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {

struct TrainerState {
  int64_t step = 0;     // the trainer's own step: the checkpoint is dir/step_<step>
  nlohmann::json user;  // anything else it wants back (the data position, its own settings)
};

struct ManagerCheckpointOptions {
  int keep_last_n = 0;  // this trainer's step directories kept (0: all)
  // With tensor or pipeline parallelism, the world and this rank's coordinates; by default the
  // manager's data-parallel group is the world.
  CheckpointGroups groups;
};

class ManagerCheckpoints {
 public:
  ManagerCheckpoints(std::string dir, ShardManager& manager, ManagerCheckpointOptions options = {});

  // Writes dir/step_<state.step> and points dir/latest at it. A step directory in the way that
  // another run or a user wrote is an error naming it; this trainer's own (a step saved again, or
  // loaded from) is replaced.
  Status Save(const TrainerState& state);
  // Loads the checkpoint dir/latest names; nullopt when dir has none (a first run).
  StatusOr<std::optional<TrainerState>> LoadLatest();
  // Loads a step directory (or a checkpoint directory's latest).
  StatusOr<TrainerState> Load(const std::string& path);

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  ShardManager& manager_;
  ManagerCheckpointOptions options_;
  // Names this trainer's step directories (rotation and replacement touch only those); a new id,
  // or the loaded checkpoint's.
  std::string run_id_;
};

}  // namespace zerort
