// MPI backend (Open MPI). MpiContext owns MPI's initialisation (unless the application already
// initialised MPI) and the process's watchdog; World() gives MPI_COMM_WORLD as a Communicator.
// Collectives are the blocking MPI calls on the caller's thread, so their speed is MPI's; the
// watchdog thread enforces their deadlines. bf16/f16 reductions are carried out in fp32 and 8-bit
// sums in int32 (see Widened() in the .cc). CUDA
// buffers are staged through pinned host memory by the Communicator base. No MPI header here.
#pragma once

#include <memory>
#include <string>

#include "runtime/communicator.h"
#include "runtime/watchdog.h"

namespace zerort {

class MpiContext {
 public:
  struct Options {
    Watchdog::Options watchdog;
    bool install_signal_dump = false;  // log collective traces on SIGTERM/SIGINT
  };

  // Calls MPI_Init_thread unless MPI is already initialised; fails in a build without MPI.
  static StatusOr<std::unique_ptr<MpiContext>> Init(int* argc, char*** argv, Options options);
  ~MpiContext();  // MPI_Finalize, if this context initialised MPI

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided
  // Whether MPI may be called from several threads at once (the asynchronous CPU device's
  // streams each call it from their own).
  bool thread_multiple() const;
  Watchdog& watchdog() { return *watchdog_; }

  StatusOr<std::unique_ptr<Communicator>> World(CommOptions options);

 private:
  MpiContext() = default;
  bool owns_init_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
};

// MPI_Get_library_version's first line, or why there is none.
std::string MpiLibraryVersion();

}  // namespace zerort
