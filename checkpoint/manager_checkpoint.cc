#include "zerort/checkpoint/manager_checkpoint.h"

#include <filesystem>
#include <utility>

#include "zerort/checkpoint/checkpoint_protocol.h"
#include "zerort/checkpoint/run_dir.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/manager_state.h"

namespace zerort {

ManagerCheckpoints::ManagerCheckpoints(std::string dir, ShardManager& manager,
                                       ManagerCheckpointOptions options)
    : dir_(std::move(dir)), manager_(manager), options_(std::move(options)), run_id_(NewRunId()) {
  if (options_.groups.world == nullptr) options_.groups.world = &ShardManagerState(manager_).dp();
  if (options_.groups.dp == nullptr) options_.groups.dp = &ShardManagerState(manager_).dp();
}

Status ManagerCheckpoints::Save(const TrainerState& state) {
  if (state.step < 0) {
    return absl::InvalidArgumentError(StrCat("checkpoint save: step ", state.step, " < 0"));
  }
  const ShardManagerState m(manager_);
  const RunState run{.step = state.step,
                     .applied_steps = m.steps(),
                     .scaler = m.scaler_state(),
                     .user = state.user,
                     .run_id = run_id_};
  return SaveCheckpoint(dir_, run, manager_, options_.groups, options_.keep_last_n);
}

StatusOr<std::optional<TrainerState>> ManagerCheckpoints::LoadLatest() {
  // Every rank must take the same branch (a load is collective): they agree on whether `latest`
  // exists, so a directory that is not shared between the ranks' machines fails here, named.
  std::error_code ec;
  const bool here = std::filesystem::exists(std::filesystem::symlink_status(dir_ + "/latest", ec));
  Communicator& world = *options_.groups.world;
  ZR_ASSIGN_OR_RETURN(const std::vector<std::string> seen,
                      AllGatherHostStrings(world, manager_.device_allocator(),
                                           manager_.compute_stream(), here ? "1" : "0"));
  for (int r = 0; r < world.size(); ++r) {
    if (seen[static_cast<size_t>(r)] != seen[0]) {
      return absl::FailedPreconditionError(
          StrCat(dir_, "/latest exists on rank ", seen[0] == "1" ? 0 : r, " and not on rank ",
                 seen[0] == "1" ? r : 0,
                 ": the checkpoint directory must be the same (shared) directory on every rank"));
    }
  }
  if (!here) return std::optional<TrainerState>();
  ZR_ASSIGN_OR_RETURN(TrainerState state, Load(dir_));
  return std::optional<TrainerState>(std::move(state));
}

StatusOr<TrainerState> ManagerCheckpoints::Load(const std::string& path) {
  // Resolved on each rank; LoadCheckpoint then agrees on every rank's success.
  StatusOr<std::string> step_dir = ResolveStepDir(path);
  std::string where = step_dir.ok() ? *step_dir : path;
  Status resolved = step_dir.status();
  RunState run;
  if (resolved.ok()) {
    StatusOr<RunState> loaded = LoadCheckpoint(where, manager_, options_.groups);
    if (!loaded.ok()) return loaded.status();
    run = std::move(*loaded);
  } else {
    ZR_RETURN_IF_ERROR(
        AgreeOnCheckpoint(manager_, *options_.groups.world, resolved, StrCat("loading ", path)));
  }
  if (!run.config.is_null()) {
    // A zerort train checkpoint loads too (its parameters by name); its run config is not the
    // trainer's to keep.
    run.user = nlohmann::json();
  }
  if (!run.run_id.empty()) run_id_ = run.run_id;
  return TrainerState{.step = run.step, .user = std::move(run.user)};
}

}  // namespace zerort
