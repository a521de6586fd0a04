// hello_comm: all-reduces each rank's number with zerort's communicators. One process runs four
// loopback ranks (threads); under mpirun it uses MPI across the processes. Exits 1 on a wrong sum.
#include <cstdio>
#include <memory>
#include <vector>

#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"

namespace {

zerort::Status SumRanks(zerort::Communicator& comm, bool* ok) {
  std::vector<float> values(1000, static_cast<float>(comm.rank() + 1));
  ZR_RETURN_IF_ERROR(comm.AllReduce(values.data(), values.data(), values.size(),
                                    zerort::DType::kF32, zerort::ReduceOp::kSum));
  const float want = comm.size() * (comm.size() + 1) / 2.0f;
  for (float v : values) *ok = *ok && v == want;
  if (comm.rank() == 0) {
    std::printf("hello_comm: %d ranks (%s), sum of 1..%d = %g (%s)\n", comm.size(),
                std::string(comm.backend()).c_str(), comm.size(), values[0],
                *ok ? "correct" : "WRONG");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto launch = zerort::DiscoverLaunchEnv(zerort::ProcessEnv());
  if (!launch.ok()) {
    std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
    return 2;
  }
  zerort::ConfigureLogging({launch->rank, launch->world_size});
  bool ok = true;
  zerort::Status status;
  if (launch->world_size > 1) {
    auto mpi = zerort::MpiContext::Init(&argc, &argv, {});
    if (!mpi.ok()) {
      std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str());
      return 1;
    }
    auto world = (*mpi)->World({});
    status = world.ok() ? SumRanks(**world, &ok) : world.status();
  } else {
    std::vector<char> oks(4, 1);
    status = zerort::RunLoopbackRanks(4, {}, nullptr, [&](zerort::Communicator& comm) {
      bool mine = true;
      auto s = SumRanks(comm, &mine);
      oks[comm.rank()] = mine;
      return s;
    });
    for (char o : oks) ok = ok && o;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "hello_comm: %s\n", status.ToString().c_str());
    return 1;
  }
  return ok ? 0 : 1;
}
