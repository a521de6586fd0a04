// Launch-environment discovery in the order documented in launch_env.h.
#include "zerort/runtime/launch_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// One source's reading: rank and size with the variable names they came from.
struct Reading {
  std::string source;
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string rank_var;
  std::string size_var;
};

StatusOr<std::optional<int>> ReadInt(const EnvLookup& env, std::string_view name) {
  std::optional<std::string> value = env(name);
  if (!value.has_value()) return std::optional<int>();
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(
        StrCat("launcher variable ", name, "='", *value, "' is not a non-negative integer"));
  }
  return std::optional<int>(parsed);
}

// Slurm writes tasks per node as "4(x2),3"; this node's count is what matters, the first is
// the right one when all nodes hold the same number, which is the common case.
std::optional<int> FirstTaskCount(const std::optional<std::string>& value) {
  if (!value.has_value()) return std::nullopt;
  std::string_view first = *value;
  first = first.substr(0, first.find_first_of("(,"));
  int parsed = 0;
  if (!absl::SimpleAtoi(std::string(first), &parsed)) return std::nullopt;
  return parsed;
}

#define ZR_READ_INT(var, env, name) ZR_ASSIGN_OR_RETURN(std::optional<int> var, ReadInt(env, name))

StatusOr<std::optional<Reading>> ReadOpenMpi(const EnvLookup& env) {
  ZR_READ_INT(rank, env, "OMPI_COMM_WORLD_RANK");
  ZR_READ_INT(size, env, "OMPI_COMM_WORLD_SIZE");
  if (!rank && !size) return std::optional<Reading>();
  ZR_READ_INT(local_rank, env, "OMPI_COMM_WORLD_LOCAL_RANK");
  ZR_READ_INT(local_size, env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  return Reading{"openmpi",
                 rank.value_or(-1),
                 size.value_or(-1),
                 local_rank.value_or(-1),
                 local_size.value_or(-1),
                 "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE"};
}

StatusOr<std::optional<Reading>> ReadPmix(const EnvLookup& env) {
  ZR_READ_INT(rank, env, "PMIX_RANK");
  if (!rank) return std::optional<Reading>();
  ZR_READ_INT(size, env, "PMIX_SIZE");
  return Reading{"pmix", *rank, size.value_or(-1), -1, -1, "PMIX_RANK", "PMIX_SIZE"};
}

StatusOr<std::optional<Reading>> ReadPmi(const EnvLookup& env) {
  ZR_READ_INT(rank, env, "PMI_RANK");
  ZR_READ_INT(size, env, "PMI_SIZE");
  if (!rank && !size) return std::optional<Reading>();
  ZR_READ_INT(local_rank, env, "MPI_LOCALRANKID");
  ZR_READ_INT(local_size, env, "MPI_LOCALNRANKS");
  return Reading{"pmi",
                 rank.value_or(-1),
                 size.value_or(-1),
                 local_rank.value_or(-1),
                 local_size.value_or(-1),
                 "PMI_RANK",
                 "PMI_SIZE"};
}

StatusOr<std::optional<Reading>> ReadSlurm(const EnvLookup& env) {
  ZR_READ_INT(rank, env, "SLURM_PROCID");
  ZR_READ_INT(size, env, "SLURM_NTASKS");
  if (!rank && !size) return std::optional<Reading>();
  ZR_READ_INT(local_rank, env, "SLURM_LOCALID");
  std::optional<int> local_size = FirstTaskCount(env("SLURM_STEP_TASKS_PER_NODE"));
  if (!local_size) local_size = FirstTaskCount(env("SLURM_TASKS_PER_NODE"));
  return Reading{"slurm",
                 rank.value_or(-1),
                 size.value_or(-1),
                 local_rank.value_or(-1),
                 local_size.value_or(-1),
                 "SLURM_PROCID",
                 "SLURM_NTASKS"};
}

StatusOr<std::optional<Reading>> ReadTorchrun(const EnvLookup& env) {
  ZR_READ_INT(rank, env, "RANK");
  ZR_READ_INT(size, env, "WORLD_SIZE");
  if (!rank && !size) return std::optional<Reading>();
  ZR_READ_INT(local_rank, env, "LOCAL_RANK");
  ZR_READ_INT(local_size, env, "LOCAL_WORLD_SIZE");
  return Reading{"torchrun",
                 rank.value_or(-1),
                 size.value_or(-1),
                 local_rank.value_or(-1),
                 local_size.value_or(-1),
                 "RANK",
                 "WORLD_SIZE"};
}

#undef ZR_READ_INT

}  // namespace

std::string LaunchEnv::ToString() const {
  std::string out = StrCat("launch environment: ", source, ", rank ", rank, " of ", world_size,
                           ", local rank ", local_rank, " of ", local_world_size);
  for (const std::string& note : notes) StrAppend(&out, "; ", note);
  return out;
}

EnvLookup ProcessEnv() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

StatusOr<LaunchEnv> DiscoverLaunchEnv(const EnvLookup& env) {
  std::vector<Reading> readings;
  for (auto* read : {&ReadOpenMpi, &ReadPmix, &ReadPmi, &ReadSlurm, &ReadTorchrun}) {
    ZR_ASSIGN_OR_RETURN(std::optional<Reading> reading, (*read)(env));
    if (reading.has_value()) readings.push_back(*reading);
  }
  LaunchEnv result;
  if (readings.empty()) return result;

  const bool under_mpirun = readings.front().source == "openmpi";
  std::vector<Reading> used;
  for (const Reading& r : readings) {
    if (under_mpirun && r.source == "slurm") {
      result.notes.push_back(
          "SLURM_* variables ignored: under mpirun they describe mpirun's own job step");
      continue;
    }
    used.push_back(r);
  }

  // World size may come from a later source (PMIx often exports only the rank).
  Reading primary = used.front();
  for (const Reading& r : used) {
    if (primary.world_size < 0 && r.world_size >= 0) {
      primary.world_size = r.world_size;
      primary.size_var = r.size_var;
    }
    if (primary.local_rank < 0 && r.local_rank >= 0) primary.local_rank = r.local_rank;
    if (primary.local_world_size < 0 && r.local_world_size >= 0) {
      primary.local_world_size = r.local_world_size;
    }
  }
  if (primary.rank < 0) {
    return absl::InvalidArgumentError(
        StrCat(primary.size_var, " is set but ", primary.rank_var, " is not"));
  }
  if (primary.world_size < 0) {
    return absl::InvalidArgumentError(StrCat(primary.rank_var,
                                             " is set but no launcher "
                                             "variable gives the world size (",
                                             primary.size_var, ")"));
  }
  if (primary.world_size == 0 || primary.rank >= primary.world_size) {
    return absl::InvalidArgumentError(StrCat(primary.rank_var, "=", primary.rank, " with ",
                                             primary.size_var, "=", primary.world_size,
                                             ": the rank must be below the world size"));
  }
  for (const Reading& r : used) {
    if (r.rank >= 0 && r.rank != primary.rank) {
      return absl::InvalidArgumentError(
          StrCat("launcher variables disagree on this process's rank: ", primary.rank_var, "=",
                 primary.rank, " (", primary.source, ") but ", r.rank_var, "=", r.rank, " (",
                 r.source, "); unset the stale ones"));
    }
    if (r.world_size >= 0 && r.world_size != primary.world_size) {
      return absl::InvalidArgumentError(
          StrCat("launcher variables disagree on the world size: ", primary.size_var, "=",
                 primary.world_size, " (", primary.source, ") but ", r.size_var, "=", r.world_size,
                 " (", r.source, "); unset the stale ones"));
    }
  }

  result.source = primary.source;
  result.rank = primary.rank;
  result.world_size = primary.world_size;
  result.local_rank = primary.local_rank >= 0 ? primary.local_rank : primary.rank;
  result.local_world_size =
      primary.local_world_size > 0 ? primary.local_world_size : primary.world_size;
  result.local_known = primary.local_rank >= 0 && primary.local_world_size > 0;
  if (result.local_rank >= result.local_world_size) {
    return absl::InvalidArgumentError(StrCat("local rank ", result.local_rank,
                                             " is not below the local world size ",
                                             result.local_world_size, " (", primary.source, ")"));
  }
  return result;
}

}  // namespace zerort
