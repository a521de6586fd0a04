// Launch-environment discovery: who started this process and as which rank. zerort starts no
// processes itself; mpirun, srun or a torchrun-style launcher does, and leaves variables behind.
// Sources are read in this order, the first present one wins:
//   1. Open MPI (mpirun):    OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
//   2. PMIx (srun --mpi=pmix, prun): PMIX_RANK with PMIX_SIZE or the world size of another source
//   3. PMI-1/2 (MPICH Hydra, srun --mpi=pmi2): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   4. Slurm (srun):         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE
//   5. torchrun style:       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   6. none: a single process, rank 0 of 1.
// Every other source that is present must agree on rank and world size, or discovery fails
// naming both, except Slurm's variables under mpirun: there they describe mpirun's daemon step
// (mpirun inside an allocation), not this process, and are reported as ignored.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  bool local_known = false;        // the launcher said local rank and size (else rank and world)
  std::string source = "none";     // "openmpi", "pmix", "pmi", "slurm", "torchrun", "none"
  std::vector<std::string> notes;  // sources that were present but ignored, and why

  std::string ToString() const;  // one line for the log
};

// Reads a variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

// The process environment (getenv).
EnvLookup ProcessEnv();

// Fails (InvalidArgument) on malformed numbers, out-of-range ranks and sources that disagree.
StatusOr<LaunchEnv> DiscoverLaunchEnv(const EnvLookup& env);

}  // namespace zerort
