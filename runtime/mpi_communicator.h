// MPI backend (Open MPI). MpiContext owns MPI's initialisation (unless the application already
// initialised MPI) and the process's watchdog; World() gives MPI_COMM_WORLD as a Communicator.
// Collectives are the blocking MPI calls on the caller's thread, so their speed is MPI's; the
// watchdog thread enforces their deadlines. bf16/f16 reductions are carried out in fp32 and 8-bit
// sums in int32 (see Widened() in the .cc). CUDA
// buffers are staged through pinned host memory by the Communicator base. No MPI header here.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {

class MpiContext {
 public:
  struct Options {
    Watchdog::Options watchdog;
    bool install_signal_dump = false;  // log collective traces on SIGTERM/SIGINT
  };

  // Calls MPI_Init_thread unless MPI is already initialised; fails in a build without MPI.
  static StatusOr<std::unique_ptr<MpiContext>> Init(int* argc, char*** argv, Options options);
  // Meets the other ranks at the exit ([Note: leaving after an error]), then MPI_Finalize if this
  // context initialised MPI.
  ~MpiContext();

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided
  // Whether MPI may be called from several threads at once (the asynchronous CPU device's
  // streams each call it from their own).
  bool thread_multiple() const;
  Watchdog& watchdog() { return *watchdog_; }

  StatusOr<std::unique_ptr<Communicator>> World(CommOptions options);

  // [Note: leaving after an error]
  // A rank that failed on its own (an I/O error, a bad file only it reads) stops joining
  // collectives, while the others wait in their next one: they would sit there until their
  // watchdog fires (collective_timeout_s, 600 s by default) and then report a timeout (exit 3)
  // instead of the error, and this rank would wait for them in MPI_Finalize. So every rank meets
  // the others at the exit, on a communicator of its own (MPI_COMM_WORLD may hold a peer's
  // unmatched collective): the destructor posts its barrier and waits, and a rank about to exit
  // after an error calls EndAfterError, which waits up to `grace` for every rank to reach the exit
  // (an error they share, or their normal end) and otherwise logs why and ends the whole job now
  // with MPI_Abort(exit_code), the code mpirun then returns. It returns when every rank arrived.
  void EndAfterError(int exit_code, std::chrono::milliseconds grace);

 private:
  struct ExitBarrier;  // the exit's communicator and request (MPI types stay in the .cc)
  MpiContext();
  bool owns_init_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<ExitBarrier> exit_;
};

// MPI_Get_library_version's first line, or why there is none.
std::string MpiLibraryVersion();

}  // namespace zerort
