// Device mesh: Megatron's rank order and working sub-groups (8 loopback ranks, 2 x 2 x 2).
#include "zerort/runtime/device_mesh.h"

#include "gtest/gtest.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/topology.h"

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

TEST(TopologyTest, HostnamesAndSimulatedNodes) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "a", "b"};
  const Topology real = TopologyFromHosts(hosts);
  EXPECT_EQ(real.nodes(), 2);
  EXPECT_EQ(real.RanksOf(1), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(real.Describe(), "2 nodes x 3 ranks (hostnames)");
  const std::vector<int> on_a = {0, 1, 4}, mixed = {1, 2};
  EXPECT_TRUE(real.OneNode(on_a));
  EXPECT_FALSE(real.OneNode(mixed));

  const Topology one = SingleNode(4, "h");
  StatusOr<Topology> simulated = SimulatedTopology(one, 2);
  ASSERT_TRUE(simulated.ok());
  const Topology& sim = *simulated;
  EXPECT_EQ(sim.node_of_rank, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(sim.Describe(), "2 nodes x 2 ranks (ZERORT_RANKS_PER_NODE=2)");
  EXPECT_EQ(SimulatedTopology(one, 3).status().code(), absl::StatusCode::kInvalidArgument);
  // A simulated node may not span two real hosts.
  const Topology split = TopologyFromHosts(std::vector<std::string>{"a", "b", "a", "b"});
  StatusOr<Topology> spans = SimulatedTopology(split, 2);
  ASSERT_FALSE(spans.ok());
  EXPECT_NE(spans.status().message().find("different hosts"), std::string::npos);

  auto env = [](std::string value) {
    return [value](std::string_view name) -> std::optional<std::string> {
      if (name == kRanksPerNodeVar) return value;
      return std::nullopt;
    };
  };
  EXPECT_EQ(*RanksPerNodeOverride(env("4")), 4);
  for (const char* bad : {"0", "-1", "x", ""}) {
    StatusOr<std::optional<int>> k = RanksPerNodeOverride(env(bad));
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_NE(k.status().message().find("ZERORT_RANKS_PER_NODE"), std::string::npos);
  }
}

TEST(TopologyTest, LauncherMustAgreeWithHostnames) {
  const Topology t = TopologyFromHosts(std::vector<std::string>{"a", "a", "b", "b"});
  LaunchEnv launch;
  launch.source = "openmpi";
  launch.rank = 3;
  launch.world_size = 4;
  launch.local_rank = 1;
  launch.local_world_size = 2;
  launch.local_known = true;
  EXPECT_TRUE(CheckLaunchAgrees(t, launch).ok());
  launch.local_world_size = 4;
  EXPECT_EQ(CheckLaunchAgrees(t, launch).code(), absl::StatusCode::kInvalidArgument);
  launch.local_world_size = 2;
  launch.local_rank = 0;
  EXPECT_EQ(CheckLaunchAgrees(t, launch).code(), absl::StatusCode::kInvalidArgument);
  launch.local_known = false;  // the launcher said nothing about nodes
  EXPECT_TRUE(CheckLaunchAgrees(t, launch).ok());
}

// 8 ranks as 2 nodes x 4, tensor 2 x data 4, shard groups of 2: every new group holds the ranks
// the formula says, knows whether it crosses nodes, and its bytes go to the right counter.
TEST(DeviceMeshTest, NodeAndHybridShardingGroups) {
  const MeshShape shape{.data = 4, .tensor = 2, .pipeline = 1, .data_shard = 2};
  StatusOr<Topology> simulated = SimulatedTopology(SingleNode(8, "h"), 4);
  ASSERT_TRUE(simulated.ok());
  const Topology& topology = *simulated;
  std::vector<std::string> errors(8);
  CommOptions options;
  options.timeout = std::chrono::seconds(30);
  ASSERT_TRUE(RunLoopbackRanks(8, options, nullptr, [&](Communicator& world) -> Status {
                auto bytes = std::make_shared<LinkBytes>();
                world.recorder().SetLinkBytes(bytes);
                ZR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMesh> mesh,
                                    DeviceMesh::Create(world, shape, options, &topology));
                const MeshCoord c = mesh->coord();
                std::string& e = errors[world.rank()];
                auto members = [&](Communicator* g) -> StatusOr<std::vector<int32_t>> {
                  if (g == nullptr) return std::vector<int32_t>();
                  std::vector<int32_t> all(static_cast<size_t>(g->size()));
                  const int32_t me = world.rank();
                  ZR_RETURN_IF_ERROR(g->AllGather(&me, all.data(), 1, DType::kI32));
                  return all;
                };
                auto expect = [&](const char* what, Communicator* g, std::vector<int32_t> want,
                                  bool crosses) -> Status {
                  ZR_ASSIGN_OR_RETURN(std::vector<int32_t> got, members(g));
                  if (got != want) e += StrCat(what, " members differ; ");
                  if (g != nullptr && g->options().crosses_nodes != crosses)
                    e += StrCat(what, " crossing; ");
                  return absl::OkStatus();
                };
                // Data ranks of tensor coordinate t: world ranks t, t+2, t+4, t+6 (node 0 holds
                // t and t+2).
                const int t = c.tensor;
                ZR_RETURN_IF_ERROR(expect("dp", &mesh->data(), {t, t + 2, t + 4, t + 6}, true));
                const int block = c.data / 2;
                ZR_RETURN_IF_ERROR(expect("shard", &mesh->data_shard(),
                                          {t + 4 * block, t + 4 * block + 2}, false));
                ZR_RETURN_IF_ERROR(expect("replicate", mesh->data_replicate(),
                                          {t + 2 * (c.data % 2), t + 2 * (c.data % 2) + 4}, true));
                ZR_RETURN_IF_ERROR(
                    expect("intra", mesh->data_intra(), {t + 4 * block, t + 4 * block + 2}, false));
                ZR_RETURN_IF_ERROR(expect("inter", mesh->data_inter(),
                                          {t + 2 * (c.data % 2), t + 2 * (c.data % 2) + 4}, true));
                ZR_RETURN_IF_ERROR(
                    expect("tp", &mesh->tensor(), {world.rank() - t, world.rank() - t + 1}, false));
                // [Note: bytes on the wire]: the members' all-gathers above sent 4 B per other
                // member; the mesh's own splits none.
                const int64_t intra = bytes->intra.load(), inter = bytes->inter.load();
                if (intra != 4 * (1 + 1 + 1) || inter != 4 * (3 + 1 + 1)) {
                  e += StrCat("wire bytes intra ", intra, " inter ", inter, "; ");
                }
                if (mesh->DescribeGroups().find("world.dp_shard: ranks") == std::string::npos) {
                  e += "DescribeGroups: " + mesh->DescribeGroups();
                }
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace zerort
