// Mesh coordinates and the process groups of a rank.
#include "zerort/runtime/device_mesh.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_join.h"
#include "zerort/runtime/strings.h"

namespace zerort {

MeshCoord MeshCoordOf(int rank, const MeshShape& shape) {
  MeshCoord coord;
  coord.tensor = rank % shape.tensor;
  coord.data = (rank / shape.tensor) % shape.data;
  coord.pipeline = rank / (shape.tensor * shape.data);
  return coord;
}

int MeshRankOf(const MeshCoord& coord, const MeshShape& shape) {
  return (coord.pipeline * shape.data + coord.data) * shape.tensor + coord.tensor;
}

namespace {

// The world ranks whose coordinates satisfy `member`, ascending.
std::vector<int> Members(const MeshShape& shape,
                         const std::function<bool(const MeshCoord&)>& member) {
  std::vector<int> ranks;
  for (int r = 0; r < shape.world_size(); ++r) {
    if (member(MeshCoordOf(r, shape))) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(Communicator& world, MeshShape shape,
                                                         const CommOptions& options,
                                                         const Topology* topology) {
  if (shape.data < 1 || shape.tensor < 1 || shape.pipeline < 1 || shape.data_shard < 0) {
    return absl::InvalidArgumentError(StrCat("mesh sizes must be at least 1: data=", shape.data,
                                             " tensor=", shape.tensor,
                                             " pipeline=", shape.pipeline));
  }
  if (shape.world_size() != world.size()) {
    return absl::InvalidArgumentError(
        StrCat("mesh data=", shape.data, " x tensor=", shape.tensor, " x pipeline=", shape.pipeline,
               " = ", shape.world_size(), " ranks, but the world has ", world.size()));
  }
  if (shape.data % shape.shard_size() != 0) {
    return absl::InvalidArgumentError(StrCat("the shard group size ", shape.data_shard,
                                             " does not divide the data-parallel size ",
                                             shape.data));
  }
  if (shape.data_secondary > 1 && shape.shard_size() % shape.data_secondary != 0) {
    return absl::InvalidArgumentError(StrCat("the hpZ group size ", shape.data_secondary,
                                             " does not divide the shard group size ",
                                             shape.shard_size()));
  }
  if (topology != nullptr && topology->world_size() != world.size()) {
    return absl::InvalidArgumentError(StrCat("the topology has ", topology->world_size(),
                                             " ranks, but the world has ", world.size()));
  }
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(world, shape));
  const MeshCoord c = MeshCoordOf(world.rank(), shape);
  mesh->coord_ = c;
  const int pt = c.pipeline * shape.tensor + c.tensor;  // this rank's data group
  // Each group's options: its name, and whether its members (world ranks) cross nodes.
  auto named = [&](std::string_view name, const std::vector<int>& members) {
    CommOptions o = options;
    o.name = StrCat(options.name, ".", name);
    o.crosses_nodes = topology != nullptr && !members.empty() && !topology->OneNode(members);
    if (members.size() > 1 &&
        std::find(members.begin(), members.end(), world.rank()) != members.end()) {
      mesh->groups_ +=
          StrCat(mesh->groups_.empty() ? "" : "\n", o.name, ": ranks ", absl::StrJoin(members, ","),
                 o.crosses_nodes ? " (crosses nodes)" : "");
    }
    return o;
  };
  auto members = [&](auto member) {
    return Members(shape, [&](const MeshCoord& o) { return member(o); });
  };
  ZR_ASSIGN_OR_RETURN(mesh->tensor_, world.Split(c.pipeline * shape.data + c.data, c.tensor,
                                                 named("tp", members([&](const MeshCoord& o) {
                                                         return o.pipeline == c.pipeline &&
                                                                o.data == c.data;
                                                       }))));
  const std::vector<int> data_members =
      members([&](const MeshCoord& o) { return o.pipeline == c.pipeline && o.tensor == c.tensor; });
  ZR_ASSIGN_OR_RETURN(mesh->data_, world.Split(pt, c.data, named("dp", data_members)));
  ZR_ASSIGN_OR_RETURN(mesh->pipeline_, world.Split(c.data * shape.tensor + c.tensor, c.pipeline,
                                                   named("pp", members([&](const MeshCoord& o) {
                                                           return o.data == c.data &&
                                                                  o.tensor == c.tensor;
                                                         }))));
  ZR_ASSIGN_OR_RETURN(
      mesh->model_parallel_,
      world.Split(c.data, c.pipeline * shape.tensor + c.tensor,
                  named("mp", members([&](const MeshCoord& o) { return o.data == c.data; }))));
  // The first and last stage of each pipeline (Megatron's embedding group), when there are two.
  auto end_stage = [&](int p) { return p == 0 || p == shape.pipeline - 1; };
  const bool ends = shape.pipeline > 1 && end_stage(c.pipeline);
  ZR_ASSIGN_OR_RETURN(mesh->embedding_,
                      world.Split(ends ? c.data * shape.tensor + c.tensor : kNoColor, c.pipeline,
                                  named("emb", ends ? members([&](const MeshCoord& o) {
                                          return o.data == c.data && o.tensor == c.tensor &&
                                                 end_stage(o.pipeline);
                                        })
                                                    : std::vector<int>())));
  // [Note: hybrid sharding]: shard groups of consecutive data ranks, replicated across.
  if (shape.replicas() > 1) {
    const int s = shape.shard_size(), block = c.data / s;
    ZR_ASSIGN_OR_RETURN(mesh->data_shard_,
                        world.Split(pt * shape.replicas() + block, c.data,
                                    named("dp_shard", members([&](const MeshCoord& o) {
                                            return o.pipeline == c.pipeline &&
                                                   o.tensor == c.tensor && o.data / s == block;
                                          }))));
    ZR_ASSIGN_OR_RETURN(mesh->data_replicate_,
                        world.Split(pt * s + c.data % s, c.data,
                                    named("dp_replicate", members([&](const MeshCoord& o) {
                                            return o.pipeline == c.pipeline &&
                                                   o.tensor == c.tensor && o.data % s == c.data % s;
                                          }))));
  }
  // hpZ: groups of h consecutive data ranks (inside a shard group, h dividing its size).
  if (shape.data_secondary > 1) {
    const int h = shape.data_secondary, block = c.data / h;
    ZR_ASSIGN_OR_RETURN(mesh->data_secondary_,
                        world.Split(pt * (shape.data / h) + block, c.data,
                                    named("dp_hpz", members([&](const MeshCoord& o) {
                                            return o.pipeline == c.pipeline &&
                                                   o.tensor == c.tensor && o.data / h == block;
                                          }))));
  }
  // The data group's ranks by node. Every rank computes the same answer for every data group
  // (coordinates and topology are global), so every rank takes part in the same splits.
  if (topology != nullptr && topology->nodes() > 1) {
    std::vector<int> index_on_node(static_cast<size_t>(world.size()), 0);
    bool balanced = true;
    for (int group = 0; group < shape.pipeline * shape.tensor; ++group) {
      std::vector<int> count(static_cast<size_t>(topology->nodes()), 0);
      for (int d = 0; d < shape.data; ++d) {
        const int r = MeshRankOf({d, group % shape.tensor, group / shape.tensor}, shape);
        index_on_node[r] = count[topology->node(r)]++;
      }
      std::vector<int> used;
      for (int n : count) {
        if (n > 0) used.push_back(n);
      }
      balanced &= std::all_of(used.begin(), used.end(), [&](int n) { return n == used[0]; });
    }
    const int my_node = topology->node(world.rank());
    const int index = index_on_node[world.rank()];
    std::vector<int> on_my_node, across;
    for (int r : data_members) {
      if (topology->node(r) == my_node) on_my_node.push_back(r);
      if (index_on_node[r] == index) across.push_back(r);
    }
    if (!balanced) on_my_node.clear(), across.clear();
    ZR_ASSIGN_OR_RETURN(mesh->data_intra_,
                        world.Split(balanced ? pt * topology->nodes() + my_node : kNoColor, c.data,
                                    named("dp_intra", on_my_node)));
    ZR_ASSIGN_OR_RETURN(mesh->data_inter_,
                        world.Split(balanced ? pt * shape.data + index : kNoColor, c.data,
                                    named("dp_inter", across)));
    if (!balanced) {
      mesh->groups_ +=
          "\n(no intra/inter-node data groups: the nodes hold different numbers of some data "
          "group's ranks)";
    }
  }
  return mesh;
}

std::string DeviceMesh::DescribeGroups() const { return groups_; }

}  // namespace zerort
