// The unit tests' main: the CPU thread team waits as zerort's own command does ([Note: OpenMP
// waits on a busy machine], kernels/openmp_waits.h), so that ctest's parallel tests on a small
// machine do not spin against each other; then GoogleTest.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "zerort/kernels/openmp_waits.h"

int main(int argc, char** argv) {
  (void)zerort::ReexecWithOpenMpWaits(argv);  // a failure leaves libgomp's default: still correct
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
