// Launch-environment discovery for each launcher, precedence, and disagreement errors.
#include "zerort/runtime/launch_env.h"

#include <map>

#include "gtest/gtest.h"

namespace zerort {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnvTest, NoLauncherIsOneProcess) {
  LaunchEnv e = *DiscoverLaunchEnv(Env({}));
  EXPECT_EQ(e.source, "none");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnvTest, OpenMpi) {
  LaunchEnv e = *DiscoverLaunchEnv(Env({{"OMPI_COMM_WORLD_RANK", "3"},
                                        {"OMPI_COMM_WORLD_SIZE", "8"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

TEST(LaunchEnvTest, PmixTakesSizeFromSlurm) {
  LaunchEnv e = *DiscoverLaunchEnv(Env({{"PMIX_RANK", "5"},
                                        {"SLURM_PROCID", "5"},
                                        {"SLURM_NTASKS", "16"},
                                        {"SLURM_LOCALID", "1"},
                                        {"SLURM_STEP_TASKS_PER_NODE", "4(x4)"}}));
  EXPECT_EQ(e.source, "pmix");
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
}

TEST(LaunchEnvTest, Pmi) {
  LaunchEnv e = *DiscoverLaunchEnv(Env(
      {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}));
  EXPECT_EQ(e.source, "pmi");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_world_size, 1);
}

TEST(LaunchEnvTest, SlurmSrun) {
  LaunchEnv e = *DiscoverLaunchEnv(Env({{"SLURM_PROCID", "7"},
                                        {"SLURM_NTASKS", "8"},
                                        {"SLURM_LOCALID", "3"},
                                        {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}}));
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 7);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 4);
}

TEST(LaunchEnvTest, Torchrun) {
  LaunchEnv e = *DiscoverLaunchEnv(
      Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 1);
}

TEST(LaunchEnvTest, SlurmVariablesUnderMpirunAreIgnored) {
  // mpirun inside an allocation: SLURM_PROCID describes mpirun's daemon step, not this rank.
  LaunchEnv e = *DiscoverLaunchEnv(Env({{"OMPI_COMM_WORLD_RANK", "3"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  ASSERT_EQ(e.notes.size(), 1u);
  EXPECT_NE(e.notes[0].find("SLURM_* variables ignored"), std::string::npos);
}

TEST(LaunchEnvTest, DisagreementNamesBothVariables) {
  StatusOr<LaunchEnv> e = DiscoverLaunchEnv(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                                 {"RANK", "1"},
                                                 {"WORLD_SIZE", "8"}}));
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("OMPI_COMM_WORLD_SIZE=4"), std::string_view::npos)
      << e.status();
  EXPECT_NE(e.status().message().find("WORLD_SIZE=8"), std::string_view::npos) << e.status();
  StatusOr<LaunchEnv> r = DiscoverLaunchEnv(
      Env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SLURM_PROCID=2"), std::string_view::npos) << r.status();
}

TEST(LaunchEnvTest, MalformedValuesAreErrors) {
  EXPECT_FALSE(DiscoverLaunchEnv(Env({{"RANK", "x"}, {"WORLD_SIZE", "2"}})).ok());
  EXPECT_FALSE(DiscoverLaunchEnv(Env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})).ok());
  EXPECT_FALSE(DiscoverLaunchEnv(Env({{"PMIX_RANK", "0"}})).ok()) << "no world size anywhere";
  EXPECT_FALSE(DiscoverLaunchEnv(Env({{"WORLD_SIZE", "2"}})).ok()) << "size without rank";
}

}  // namespace
}  // namespace zerort
