// The MPI context of an MPI test binary, set up by mpi_test_main.cc's main() before the tests.
#pragma once

#include "zerort/runtime/mpi_communicator.h"

namespace zerort::testing {

MpiContext& Mpi();

}  // namespace zerort::testing
