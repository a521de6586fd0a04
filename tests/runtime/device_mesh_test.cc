// Device mesh: Megatron's rank order and working sub-groups (8 loopback ranks, 2 x 2 x 2).
#include "runtime/device_mesh.h"

#include "gtest/gtest.h"
#include "runtime/loopback_communicator.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

TEST(DeviceMeshTest, TensorFastestThenDataThenPipeline) {
  const MeshShape shape{.data = 2, .tensor = 4, .pipeline = 3};
  for (int r = 0; r < shape.world_size(); ++r) {
    const MeshCoord c = MeshCoordOf(r, shape);
    EXPECT_EQ(MeshRankOf(c, shape), r);
  }
  EXPECT_EQ(MeshCoordOf(1, shape), (MeshCoord{.data = 0, .tensor = 1, .pipeline = 0}));
  EXPECT_EQ(MeshCoordOf(4, shape), (MeshCoord{.data = 1, .tensor = 0, .pipeline = 0}));
  EXPECT_EQ(MeshCoordOf(8, shape), (MeshCoord{.data = 0, .tensor = 0, .pipeline = 1}));
}

TEST(DeviceMeshTest, GroupsHoldTheRightRanks) {
  const MeshShape shape{.data = 2, .tensor = 2, .pipeline = 2};
  std::vector<std::string> errors(8);
  CommOptions options;
  options.timeout = std::chrono::seconds(30);
  ASSERT_TRUE(RunLoopbackRanks(8, options, nullptr, [&](Communicator& world) -> Status {
                ZR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMesh> mesh,
                                    DeviceMesh::Create(world, shape, options));
                const MeshCoord c = mesh->coord();
                // Sum of world ranks over each group, compared with the ranks the formula puts
                // there.
                auto sum_over = [&](Communicator& g, auto member) -> StatusOr<int> {
                  int32_t v = world.rank();
                  ZR_RETURN_IF_ERROR(g.AllReduce(&v, &v, 1, DType::kI32, ReduceOp::kSum));
                  int want = 0;
                  for (int r = 0; r < 8; ++r) want += member(MeshCoordOf(r, shape)) ? r : 0;
                  if (v != want)
                    errors[world.rank()] += StrCat(g.name(), " sum ", v, " want ", want, "; ");
                  return v;
                };
                ZR_RETURN_IF_ERROR(sum_over(mesh->tensor(), [&](MeshCoord o) {
                                     return o.data == c.data && o.pipeline == c.pipeline;
                                   }).status());
                ZR_RETURN_IF_ERROR(sum_over(mesh->data(), [&](MeshCoord o) {
                                     return o.tensor == c.tensor && o.pipeline == c.pipeline;
                                   }).status());
                ZR_RETURN_IF_ERROR(sum_over(mesh->pipeline(), [&](MeshCoord o) {
                                     return o.tensor == c.tensor && o.data == c.data;
                                   }).status());
                if (mesh->tensor().rank() != c.tensor || mesh->data().rank() != c.data ||
                    mesh->pipeline().rank() != c.pipeline) {
                  errors[world.rank()] += "group ranks differ from mesh coordinates; ";
                }
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DeviceMeshTest, ShapeMustMatchWorld) {
  CommOptions options;
  ASSERT_TRUE(RunLoopbackRanks(2, options, nullptr, [&](Communicator& world) -> Status {
                StatusOr<std::unique_ptr<DeviceMesh>> mesh =
                    DeviceMesh::Create(world, {.data = 3}, options);
                EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
                return absl::OkStatus();
              }).ok());
}

}  // namespace
}  // namespace zerort
