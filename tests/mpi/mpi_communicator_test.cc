// MPI collectives under mpirun (-np 1, 2, 3, 4): the same semantics checks as loopback, sub-groups
// from Split and from the device mesh, and CUDA buffers staged through pinned memory when a GPU
// is present.
#include "zerort/runtime/mpi_communicator.h"

#include "gtest/gtest.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/runtime/comm_test_util.h"
#include "zerort/runtime/device_mesh.h"

namespace zerort {
namespace {

CommOptions Options() {
  CommOptions o;
  o.timeout = std::chrono::seconds(120);
  return o;
}

TEST(MpiCommunicatorTest, EveryCollectiveEveryDtype) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  EXPECT_EQ(testing::CheckEverything(*world, 99 + world->size()), "");
}

TEST(MpiCommunicatorTest, CollectivesOnQueuedCpuStreamsRunOnTheirThreads) {
  // MPI called from each rank's comm stream thread (MPI_THREAD_MULTIPLE), in the stream's order.
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    EXPECT_EQ(testing::CheckQueuedCollectives(*world, seed), "") << "seed " << seed;
  }
}

TEST(MpiCommunicatorTest, OneCommunicatorsOperationsRunInIssueOrderAcrossStreams) {
  // [Note: one communicator, one order]: two queued streams' threads and the host use one MPI
  // communicator, each in its turn.
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    EXPECT_EQ(testing::CheckIssueOrderAcrossStreams(*world, seed), "") << "seed " << seed;
  }
}

TEST(MpiCommunicatorTest, SplitEvenOdd) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  StatusOr<std::unique_ptr<Communicator>> sub =
      world->Split(world->rank() % 2, world->rank(), Options());
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ((*sub)->size(), (world->size() + 1 - world->rank() % 2) / 2);
  EXPECT_EQ((*sub)->rank(), world->rank() / 2);
  EXPECT_EQ(testing::CheckEverything(**sub, 5), "");
  StatusOr<std::unique_ptr<Communicator>> none = world->Split(kNoColor, 0, Options());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(MpiCommunicatorTest, DeviceMeshGroups) {
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  if (world->size() != 4) GTEST_SKIP() << "the mesh test uses 4 ranks";
  StatusOr<std::unique_ptr<DeviceMesh>> mesh =
      DeviceMesh::Create(*world, {.data = 2, .tensor = 2, .pipeline = 1}, Options());
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  int32_t v = world->rank();
  ASSERT_TRUE((*mesh)->tensor().AllReduce(&v, &v, 1, DType::kI32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, world->rank() < 2 ? 0 + 1 : 2 + 3);  // tensor-parallel ranks are adjacent
  v = world->rank();
  ASSERT_TRUE((*mesh)->data().AllReduce(&v, &v, 1, DType::kI32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, world->rank() % 2 == 0 ? 0 + 2 : 1 + 3);
  v = world->rank();  // without pipeline stages, one replica is one tensor-parallel group
  ASSERT_TRUE((*mesh)->model_parallel().AllReduce(&v, &v, 1, DType::kI32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, world->rank() < 2 ? 0 + 1 : 2 + 3);
}

TEST(MpiCommunicatorTest, CudaBuffersAreStagedThroughPinnedMemory) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << QueryCuda().unavailable_reason;
  std::unique_ptr<Communicator> world = *testing::Mpi().World(Options());
  const Device device = Device::Cuda(world->rank() % CudaDeviceCount());
  MemoryTracker tracker;
  std::unique_ptr<Allocator> allocator = *MakeCudaCachingAllocator(device, &tracker);
  std::unique_ptr<Stream> stream = *CreateStream(device, "comm");
  const size_t count = 100'003;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = 0.25f * static_cast<float>(i % 97) + world->rank();
  Buffer buf = *allocator->Allocate(count * 4, MemoryCategory::kGradients, stream.get());
  ASSERT_TRUE(
      CopyBytes(buf.data(), device, host.data(), Device::Cpu(), count * 4, stream.get()).ok());
  ASSERT_TRUE(
      world->AllReduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum, stream.get())
          .ok());
  ASSERT_TRUE(
      CopyBytes(host.data(), Device::Cpu(), buf.data(), device, count * 4, stream.get()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  const int n = world->size();
  for (size_t i = 0; i < count; i += 1013) {
    EXPECT_FLOAT_EQ(host[i], n * 0.25f * static_cast<float>(i % 97) + n * (n - 1) / 2.0f);
  }
}

}  // namespace
}  // namespace zerort
