// A small MPI program for the hang tests: after one good all-reduce, rank 1 either stalls
// outside any collective ("skip") or dies ("die"), while the others enter the next all-reduce.
// Usage: hang_probe skip|die TIMEOUT_MS
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <unistd.h>

#include "zerort/runtime/log.h"
#include "zerort/runtime/mpi_communicator.h"

int main(int argc, char** argv) {
  using namespace zerort;
  if (argc != 3) return 2;
  const std::string mode = argv[1];
  MpiContext::Options options;
  options.watchdog.poll_interval = std::chrono::milliseconds(50);
  options.install_signal_dump = true;
  auto mpi = MpiContext::Init(&argc, &argv, std::move(options));
  if (!mpi.ok()) return 1;
  ConfigureLogging({(*mpi)->world_rank(), (*mpi)->world_size()});
  CommOptions comm_options;
  comm_options.timeout = std::chrono::milliseconds(std::atoi(argv[2]));
  auto world = *(*mpi)->World(comm_options);
  float x = 1;
  if (!world->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum).ok()) return 1;
  if (world->rank() == 1) {
    if (mode == "die") _exit(7);
    std::this_thread::sleep_for(std::chrono::seconds(120));  // stuck outside any collective
    return 0;
  }
  world->recorder().SetLabel("unit blocks.3 backward");
  if (!world->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum).ok()) return 1;
  return 0;
}
