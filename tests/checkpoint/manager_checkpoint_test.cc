// An embedder's checkpoints (checkpoint/manager_checkpoint.h) of the shard-manager tests' MLP, on
// loopback ranks: saved at 2 ranks, ZeRO-3 and loaded at 1 rank, ZeRO-1 (and the reverse) with
// every master and moment bitwise as saved, the counters and the trainer's own step and JSON
// back; a first run finds nothing; rotation of the trainer's own steps; another run's step
// directory in the way is refused naming it; and a checkpoint with no model config is readable by
// inspect and refused by export and zerort train's resume.
#include "zerort/checkpoint/manager_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/sharding/harness.h"
#include "zerort/checkpoint/config_match.h"
#include "zerort/checkpoint/export.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

namespace fs = std::filesystem;
using testing::MakeMlpRun;
using testing::MlpForwardBackward;

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/mckpt_" + name;
  fs::remove_all(dir);
  return dir;
}

ShardManagerOptions Options(ZeroStage stage) {
  testing::RunConfig c;
  c.stage = stage;
  return testing::Options(c);
}

// Every parameter's master and moments assembled in full (rank 0 keeps them), and the counters.
struct Snapshot {
  std::vector<std::vector<float>> state;  // per parameter, per kind: master, exp_avg, exp_avg_sq
  int64_t applied_steps = 0;
  float scale = 0;
};

// The full value of `kind` of parameter `p` of unit `u`: each rank's shard pieces placed at their
// parameter offsets, summed over the ranks (each element lives on exactly one rank; at stage 0
// on every rank).
Status Assemble(ShardManager& m, int u, int p, StateKind kind, std::vector<float>& full) {
  ShardManagerState state(m);
  const FlatLayout& layout = m.unit(u).layout();
  std::vector<float> shard(static_cast<size_t>(layout.shard_numel()));
  ZR_RETURN_IF_ERROR(state.ReadState(u, kind, shard));
  full.assign(static_cast<size_t>(layout.params()[static_cast<size_t>(p)].numel()), 0.0f);
  for (const ShardPiece& piece : layout.ShardPieces(m.unit(u).layout_rank())) {
    if (piece.param != p) continue;
    for (int64_t i = 0; i < piece.param_range.end - piece.param_range.begin; ++i) {
      full[static_cast<size_t>(piece.param_range.begin + i)] =
          shard[static_cast<size_t>(piece.shard_range.begin + i)];
    }
  }
  if (m.options().stage == ZeroStage::k0) return absl::OkStatus();  // every rank holds it all
  Communicator& dp = state.dp();
  return dp.AllReduce(full.data(), full.data(), full.size(), DType::kF32, ReduceOp::kSum);
}

Status Take(ShardManager& m, Snapshot& out) {
  out.state.clear();
  for (int u = 0; u < m.num_units(); ++u) {
    for (size_t p = 0; p < m.unit(u).layout().params().size(); ++p) {
      for (StateKind kind : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq,
                             StateKind::kExpAvgSqFresh}) {
        if (!m.optimizer().HasState(kind)) continue;
        std::vector<float> full;
        ZR_RETURN_IF_ERROR(Assemble(m, u, static_cast<int>(p), kind, full));
        out.state.push_back(std::move(full));
      }
    }
  }
  for (int u = 0; u < m.num_units(); ++u) {
    for (const OneBitLambParam& c : m.optimizer().LambParams(u)) {
      out.state.push_back({c.coeff_freeze, c.last_factor, c.scaling});
    }
  }
  out.applied_steps = ShardManagerState(m).steps();
  out.scale = m.loss_scale();
  return absl::OkStatus();
}

Status RunRanks(int world, const std::function<Status(Communicator&)>& body) {
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  return RunLoopbackRanks(world, options, nullptr, body);
}

// Trains `steps` steps at (world, stage) and saves {step 7, user} into `dir`; rank 0's snapshot.
Status TrainAndSave(const std::string& dir, int world, const ShardManagerOptions& options,
                    int steps, Snapshot& saved) {
  return RunRanks(world, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::MlpRun run, MakeMlpRun(options, comm, tracker));
    ManagerCheckpoints checkpoints(dir, *run.manager);
    ZR_ASSIGN_OR_RETURN(std::optional<TrainerState> none, checkpoints.LoadLatest());
    if (none.has_value()) return absl::InternalError("a fresh directory had a checkpoint");
    const int per_rank = testing::kGlobalBatch / world;
    for (int step = 0; step < steps; ++step) {
      ZR_RETURN_IF_ERROR(
          MlpForwardBackward(*run.manager, run.units,
                             int64_t{step} * testing::kGlobalBatch + comm.rank() * per_rank,
                             per_rank, run.manager->loss_scale())
              .status());
      ZR_RETURN_IF_ERROR(run.manager->Step({.lr = testing::kLr}).status());
    }
    Snapshot mine;
    ZR_RETURN_IF_ERROR(Take(*run.manager, mine));
    if (comm.rank() == 0) saved = mine;
    return checkpoints.Save({.step = 7, .user = {{"data_offset", 1234}, {"note", "mlp"}}});
  });
}

// A new manager at (world, stage) loads `dir`; rank 0's snapshot and trainer state.
Status Load(const std::string& dir, int world, const ShardManagerOptions& options, Snapshot& loaded,
            TrainerState& state) {
  return RunRanks(world, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::MlpRun run, MakeMlpRun(options, comm, tracker));
    ManagerCheckpoints checkpoints(dir, *run.manager);
    ZR_ASSIGN_OR_RETURN(std::optional<TrainerState> got, checkpoints.LoadLatest());
    if (!got.has_value()) return absl::InternalError("no checkpoint found");
    Snapshot mine;
    ZR_RETURN_IF_ERROR(Take(*run.manager, mine));
    if (comm.rank() == 0) {
      loaded = mine;
      state = *got;
    }
    return absl::OkStatus();
  });
}

void ExpectMovesBitwise(int save_world, ZeroStage save_stage, int load_world, ZeroStage load_stage,
                        const std::string& name) {
  const std::string dir = Fresh(name);
  Snapshot saved, loaded;
  TrainerState state;
  ASSERT_TRUE(TrainAndSave(dir, save_world, Options(save_stage), 3, saved).ok());
  const Status s = Load(dir, load_world, Options(load_stage), loaded, state);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(state.step, 7);
  EXPECT_EQ(state.user, nlohmann::json({{"data_offset", 1234}, {"note", "mlp"}}));
  EXPECT_EQ(loaded.applied_steps, 3);
  EXPECT_EQ(loaded.scale, saved.scale);
  ASSERT_EQ(loaded.state.size(), saved.state.size());
  for (size_t k = 0; k < saved.state.size(); ++k) {
    EXPECT_EQ(loaded.state[k], saved.state[k]) << "parameter " << k / 3 << " kind " << k % 3;
  }
  // Nonzero moments: a load that left them zero would not pass for an equal one.
  EXPECT_NE(saved.state[1], std::vector<float>(saved.state[1].size(), 0.0f));
}

TEST(ManagerCheckpointTest, SavedAtTwoRanksStageThreeLoadsAtOneRankStageOneBitwise) {
  ExpectMovesBitwise(2, ZeroStage::k3, 1, ZeroStage::k1, "w2s3_to_w1s1");
}

TEST(ManagerCheckpointTest, SavedAtOneRankStageOneLoadsAtTwoRanksStageThreeBitwise) {
  ExpectMovesBitwise(1, ZeroStage::k1, 2, ZeroStage::k3, "w1s1_to_w2s3");
}

ShardManagerOptions OneBitLamb(int64_t freeze_step) {
  testing::RunConfig c;
  c.stage = ZeroStage::k0;
  c.optimizer = OptimizerKind::kOneBitLamb;
  c.freeze_step = freeze_step;
  return testing::Options(c);
}

// [Note: 1-bit LAMB]: v_fresh and the per-parameter scalars travel with the checkpoint (saved
// after two compressed steps at 2 ranks, loaded at 1); a LAMB checkpoint lacks them, which only
// a load that compresses next refuses.
TEST(ManagerCheckpointTest, OneBitLambStateMovesAndAnotherOptimizersIsRefusedAfterFreezeStep) {
  const std::string dir = Fresh("onebit_lamb");
  Snapshot saved, loaded;
  TrainerState state;
  ASSERT_TRUE(TrainAndSave(dir, 2, OneBitLamb(3), 5, saved).ok());
  Status s = Load(dir, 1, OneBitLamb(3), loaded, state);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(loaded.state.size(), saved.state.size());
  for (size_t k = 0; k < saved.state.size(); ++k) EXPECT_EQ(loaded.state[k], saved.state[k]) << k;
  const std::vector<float>& scalars = saved.state.back();  // the last parameter's
  EXPECT_GT(scalars[0], 0.0f);                             // the frozen coefficient
  EXPECT_NE(scalars[1], 1.0f);                             // the factor moved
  EXPECT_GT(scalars[2], 0.0f);                             // the scaling was set
  // The scalars gone from the metadata (v_fresh kept): refused after freeze_step, naming them.
  const std::string meta_path = dir + "/step_7/metadata.json";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(meta_path));
  for (auto& p : meta["params"]) p.erase("onebit_lamb");
  std::ofstream(meta_path) << meta.dump();
  s = Load(dir, 1, OneBitLamb(3), loaded, state);
  EXPECT_NE(s.message().find("holds no 1-bit LAMB coefficients for"), std::string::npos) << s;

  const std::string lamb_dir = Fresh("from_lamb");
  testing::RunConfig c;
  c.stage = ZeroStage::k0;
  c.optimizer = OptimizerKind::kLamb;
  ASSERT_TRUE(TrainAndSave(lamb_dir, 1, testing::Options(c), 3, saved).ok());
  s = Load(lamb_dir, 1, OneBitLamb(3), loaded, state);
  EXPECT_NE(s.message().find("holds no exp_avg_sq_fresh state (saved with another optimizer?)"),
            std::string::npos)
      << s;
  EXPECT_TRUE(Load(lamb_dir, 1, OneBitLamb(10), loaded, state).ok());  // still in the warm-up
}

TEST(ManagerCheckpointTest, RotationAnotherRunsDirectoryAndTheToolsThatNeedAModelConfig) {
  const std::string dir = Fresh("rotate");
  const Status saved = RunRanks(2, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::MlpRun run, MakeMlpRun(Options(ZeroStage::k2), comm, tracker));
    ManagerCheckpoints checkpoints(dir, *run.manager, {.keep_last_n = 2});
    for (int64_t step : {10, 20, 30}) ZR_RETURN_IF_ERROR(checkpoints.Save({.step = step}));
    return checkpoints.Save({.step = 30});  // the same step again replaces it
  });
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_FALSE(fs::exists(dir + "/step_10"));
  EXPECT_TRUE(fs::exists(dir + "/step_20"));
  EXPECT_EQ(*LatestCheckpoint(dir), dir + "/step_30");
  const CheckpointSummary summary = *InspectCheckpoint(dir + "/step_30");
  EXPECT_TRUE(summary.ok);
  EXPECT_TRUE(summary.metadata["config"].is_null());
  EXPECT_FALSE(summary.metadata.contains("user"));

  // Another trainer (a new run id) saving into the same directory: step_20 is not its own.
  const Status other = RunRanks(1, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::MlpRun run, MakeMlpRun(Options(ZeroStage::k1), comm, tracker));
    return ManagerCheckpoints(dir, *run.manager).Save({.step = 20});
  });
  EXPECT_TRUE(absl::IsAlreadyExists(other)) << other;
  EXPECT_NE(other.message().find(dir + "/step_20"), std::string::npos) << other;

  const auto exported = ExportHuggingFace(dir + "/step_30", Fresh("rotate_export"));
  EXPECT_NE(exported.status().message().find("no model config"), std::string::npos)
      << exported.status();
  const Status resumed =
      CheckResumable(summary.metadata["config"], nlohmann::json::object(), dir + "/step_30");
  EXPECT_NE(resumed.message().find("embeds zerort"), std::string::npos) << resumed;
}

TEST(ManagerCheckpointTest, ADirectoryWithoutCheckpointsIsAFirstRunAndADamagedLatestIsAnError) {
  const std::string dir = Fresh("damaged");
  fs::create_directories(dir);
  std::ofstream(dir + "/latest") << "step_3\n";  // names a directory that does not exist
  const Status s = RunRanks(2, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::MlpRun run, MakeMlpRun(Options(ZeroStage::k3), comm, tracker));
    return ManagerCheckpoints(dir, *run.manager).LoadLatest().status();
  });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;  // not taken for a first run
  EXPECT_NE(s.message().find("step_3"), std::string::npos) << s;
}

}  // namespace
}  // namespace zerort
