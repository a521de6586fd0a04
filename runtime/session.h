// Session: a process's setup in one call, for `zerort train` and for trainers that embed zerort.
// Discovers the launch (runtime/launch_env.h: mpirun, srun, torchrun's variables, or none),
// configures the log's "[rank r/w]" prefix, initialises MPI under a launcher (with the hang
// watchdog, and the collective traces logged on SIGTERM/SIGINT), and creates the world group (NCCL
// over MPI's world on GPUs when built with NCCL, MPI's world otherwise, a group of one without a
// launcher), the memory tracker and the device allocator (cudaMalloc-backed on a GPU, host
// memory on a CPU run: "device" is where a run computes).
//
//   ZR_ASSIGN_OR_RETURN(auto session, zerort::Session::Start(&argc, &argv));
//   auto manager = zerort::ShardManager::Create(options, {.dp = &session->world(),
//       .device_allocator = &session->allocator(), .tracker = &session->tracker()});
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/memory.h"
#include "zerort/runtime/topology.h"

namespace zerort {

class MpiContext;

struct SessionOptions {
  // "cpu", "cuda", or "" for CUDA when a GPU is visible (this rank's is local_rank modulo the
  // visible GPUs), else CPU. "cuda" without a usable GPU is a FailedPrecondition error saying
  // why (no driver, a driver older than the runtime, no device visible).
  std::string device;
  // Needs MPI_THREAD_MULTIPLE (collectives issued from several threads: the asynchronous CPU
  // device's streams); an MPI without it is an InvalidArgument error.
  bool thread_multiple = false;
  // A collective that has not completed after this long stops the process with exit code 3,
  // logging every rank's last collectives and what each was for (runtime/watchdog.h).
  double collective_timeout_s = 600;
  // Installs the "[rank r/w]" log prefix (runtime/log.h); false keeps the caller's logger.
  bool configure_logging = true;
};

class Session {
 public:
  static StatusOr<std::unique_ptr<Session>> Start(int* argc, char*** argv,
                                                  const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The group the run's collectives use (its rank and size are the process's).
  Communicator& world() { return *world_; }
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  const LaunchEnv& launch() const { return launch_; }
  // Which ranks share a node ([Note: nodes] in runtime/topology.h), agreed at start.
  const Topology& topology() const { return topology_; }
  // One line saying where the world came from ("world size 2 from the openmpi launcher").
  const std::string& world_source() const { return world_source_; }
  Device device() const { return allocator_->device(); }
  Allocator& allocator() { return *allocator_; }
  MemoryTracker& tracker() { return tracker_; }
  MpiContext* mpi() { return mpi_.get(); }  // null without a launcher

  // Call before exiting with `exit_code` after an error: waits up to 5 s for the other ranks to
  // reach their exit too, and otherwise ends the whole job now with that code, instead of
  // leaving them blocked until their watchdog reports a timeout ([Note: leaving after an error]
  // in runtime/mpi_communicator.h). Without a launcher it returns at once.
  void EndAfterError(int exit_code);

 private:
  Session() = default;
  LaunchEnv launch_;
  Topology topology_;
  std::string world_source_;
  MemoryTracker tracker_;
  std::unique_ptr<MpiContext> mpi_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // MPI's world and NCCL's, or the loopback
  Communicator* world_ = nullptr;
  std::unique_ptr<Allocator> allocator_;
};

}  // namespace zerort
