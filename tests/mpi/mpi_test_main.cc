// main() of the MPI test binaries: initialises MPI, rank-prefixed logging, and lets only rank 0
// print gtest's progress (every rank's failures still fail the run through its exit code).
#include "tests/mpi/mpi_test_main.h"

#include <cstdio>

#include "gtest/gtest.h"
#include "zerort/runtime/log.h"

namespace zerort::testing {
namespace {
MpiContext* g_mpi = nullptr;
}  // namespace

MpiContext& Mpi() { return *g_mpi; }

}  // namespace zerort::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto mpi = zerort::MpiContext::Init(&argc, &argv, {});
  if (!mpi.ok()) {
    std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str());
    return 1;
  }
  zerort::ConfigureLogging({(*mpi)->world_rank(), (*mpi)->world_size()});
  zerort::testing::g_mpi = mpi->get();
  if ((*mpi)->world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  mpi->reset();
  return rc;
}
