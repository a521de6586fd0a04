// zerort train CONFIG and zerort data prepare TEXT OUT.
//
// train: the config is read and validated on every rank before anything else happens (nothing is
// created on disk before it is valid), then the paths it names are checked on each rank; then the
// data-parallel group is MPI's world under a launcher (NCCL over it on GPUs when built with NCCL),
// or a group of one.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/config.h"
#include "engine/config_schema.h"
#include "engine/deepspeed_config.h"
#include "engine/preflight.h"
#include "engine/token_file.h"
#include "engine/trainer.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "runtime/loopback_communicator.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/strings.h"
#include "tools/commands.h"

namespace zerort::cli {

int ExitCodeOf(const Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kNotFound:       // --resume without a checkpoint
    case absl::StatusCode::kDataLoss:       // a damaged checkpoint or data file
    case absl::StatusCode::kAlreadyExists:  // another run's directory, lock or metrics file
      return kExitUsage;
    default:
      return kExitRuntimeFailure;
  }
}

int RunConfigKeys() {
  std::fputs(DeepSpeedKeysMarkdown().c_str(), stdout);
  return kExitOk;
}

int RunConfigReference() {
  std::fputs(ConfigReferenceMarkdown().c_str(), stdout);
  return kExitOk;
}

int RunTrain(const TrainOptions& o, const LaunchEnv& launch, int* argc, char*** argv) {
  StatusOr<RunConfig> config = LoadRunConfig(o.config, o.overrides);
  if (!config.ok()) {
    Logger()->error("{}", config.status().message());
    return kExitUsage;
  }
  // The paths it names, on this rank's machine (reading the config touched none of them).
  if (Status paths = CheckRunPaths(*config, o.config); !paths.ok()) {
    Logger()->error("{}", paths.message());
    return kExitUsage;
  }
  if (o.resume && config->checkpoint.dir.empty()) {
    Logger()->error("{}: --resume needs checkpoint.dir", o.config);
    return kExitUsage;
  }
  if (launch.rank == 0) {
    for (const std::string& note : config->notes) Logger()->info("{}: {}", o.config, note);
    for (const std::string& w : config->warnings) Logger()->warn("{}: {}", o.config, w);
  }
  if (o.print_config) {
    // The batch triple is resolved for the data-parallel size of the world this process was
    // launched in, as train resolves it.
    RunConfig resolved = *config;
    const int model_parallel =
        resolved.parallel.tensor_parallel_size * resolved.parallel.pipeline_parallel_size;
    Status batch = absl::OkStatus();
    if (launch.world_size % model_parallel != 0) {
      batch = absl::InvalidArgumentError(
          StrCat("world size ", launch.world_size, " (", launch.source,
                 ") is not a multiple of tensor_parallel_size x pipeline_parallel_size = ",
                 model_parallel));
    } else {
      batch = ResolveBatch(resolved, launch.world_size / model_parallel,
                           model_parallel == 1
                               ? StrCat("world size from the launcher: ", launch.source)
                               : StrCat("world size from the launcher (", launch.source,
                                        ") / (tensor_parallel_size x pipeline_parallel_size)"));
    }
    if (!batch.ok()) {
      Logger()->error("{}: {}", o.config, batch.message());
      return kExitUsage;
    }
    if (launch.rank == 0) std::printf("%s\n", resolved.ToJson().dump(2).c_str());
    return kExitOk;
  }
  if (!config->logging.level.empty()) {
    if (auto level = ParseLogLevel(config->logging.level); level.ok()) Logger()->set_level(*level);
  }

  std::unique_ptr<MpiContext> mpi;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::unique_ptr<Communicator> world, nccl;
  Communicator* run_world = nullptr;  // the backend the run uses (NCCL over the MPI world)
  std::string world_source = "a single process (no launcher)";
  CommOptions comm_options;
  comm_options.name = "world";
  comm_options.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(config->parallel.collective_timeout_s * 1000.0));
  if (launch.world_size > 1) {
    MpiContext::Options mpi_options;
    mpi_options.install_signal_dump = true;
    StatusOr<std::unique_ptr<MpiContext>> m = MpiContext::Init(argc, argv, std::move(mpi_options));
    if (!m.ok()) {
      Logger()->error("starting MPI for {} ranks: {}", launch.world_size, m.status().message());
      return kExitRuntimeFailure;
    }
    mpi = std::move(*m);
    if (config->train.device == "cpu-async" && !mpi->thread_multiple()) {
      Logger()->error(
          "train.device \"cpu-async\" runs collectives on each stream's thread, which needs "
          "MPI_THREAD_MULTIPLE; this MPI provides thread level {} only (use train.device \"cpu\")",
          mpi->thread_level());
      return kExitUsage;
    }
    StatusOr<std::unique_ptr<Communicator>> w = mpi->World(comm_options);
    if (!w.ok()) {
      Logger()->error("{}", w.status().message());
      return kExitRuntimeFailure;
    }
    world = std::move(*w);
    run_world = world.get();
    world_source =
        StrCat("world size ", launch.world_size, " from the ", launch.source, " launcher");
    const bool gpu =
        config->train.device == "cuda" || (config->train.device.empty() && CudaDeviceCount() > 0);
    if (gpu) {
      StatusOr<std::unique_ptr<Communicator>> n = CreateNcclCommunicator(
          *world, Device::Cuda(launch.local_rank % std::max(1, CudaDeviceCount())), comm_options,
          &mpi->watchdog());
      if (n.ok()) {
        nccl = std::move(*n);
        run_world = nccl.get();
      } else {
        Logger()->warn("NCCL unavailable ({}); gradients go through MPI with host staging",
                       n.status().message());
      }
    }
  } else {
    StatusOr<std::vector<std::unique_ptr<Communicator>>> group =
        CreateLoopbackGroup(1, comm_options, nullptr);
    if (!group.ok()) {
      Logger()->error("{}", group.status().message());
      return kExitRuntimeFailure;
    }
    comms = std::move(*group);
    run_world = comms[0].get();
  }
  // Open MPI gives ranks a pseudo-terminal even when mpirun's own output is a pipe, so a
  // launched run never draws the bar.
  const bool progress_bar = ::isatty(STDOUT_FILENO) && launch.source == "none";
  StatusOr<TrainResult> result = Train(*config, {.world = run_world,
                                                 .world_source = world_source,
                                                 .local_rank = launch.local_rank,
                                                 .progress_bar = progress_bar,
                                                 .resume = o.resume,
                                                 .overwrite = o.overwrite,
                                                 .local_world_size = launch.local_world_size,
                                                 .faults = FaultHooks::FromEnvironment()});
  if (!result.ok()) {
    Logger()->error("{}", result.status().message());
    return ExitCodeOf(result.status());
  }
  if (result->non_finite) return kExitNonFinite;
  if (result->stopped_by_signal) return kExitOk;  // saved; continue with --resume
  return kExitOk;
}

int RunDataPrepare(const DataPrepareOptions& o) {
  // One int32 token per byte: a 2 GiB text takes 8 GiB as tokens.
  StatusOr<std::string> text = ReadDataFile(o.text, int64_t{2} << 30);
  if (!text.ok()) {
    Logger()->error("data prepare: {}", text.status().message());
    return kExitUsage;
  }
  const std::vector<int32_t> tokens = ByteTokens(*text);
  if (tokens.empty()) {
    Logger()->error("data prepare: {} is empty", o.text);
    return kExitUsage;
  }
  if (Status s = WriteTokenFile(o.out, tokens, 256); !s.ok()) {
    Logger()->error("data prepare: {}", s.message());
    return kExitRuntimeFailure;
  }
  std::printf("wrote %s: %zu byte-level tokens (vocabulary 256) from %s\n", o.out.c_str(),
              tokens.size(), o.text.c_str());
  return kExitOk;
}

}  // namespace zerort::cli
