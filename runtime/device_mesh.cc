// Mesh coordinates and the three process groups of a rank.
#include "runtime/device_mesh.h"
#include "runtime/strings.h"

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

StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(Communicator& world, MeshShape shape,
                                                         const CommOptions& options) {
  if (shape.data < 1 || shape.tensor < 1 || shape.pipeline < 1) {
    return absl::InvalidArgumentError(StrCat("mesh sizes must be at least 1: data=", shape.data,
                                             " tensor=", shape.tensor,
                                             " pipeline=", shape.pipeline));
  }
  if (shape.world_size() != world.size()) {
    return absl::InvalidArgumentError(
        StrCat("mesh data=", shape.data, " x tensor=", shape.tensor, " x pipeline=", shape.pipeline,
               " = ", shape.world_size(), " ranks, but the world has ", world.size()));
  }
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(world, shape));
  const MeshCoord c = MeshCoordOf(world.rank(), shape);
  mesh->coord_ = c;
  auto named = [&](std::string_view name) {
    CommOptions o = options;
    o.name = StrCat(options.name, ".", name);
    return o;
  };
  ZR_ASSIGN_OR_RETURN(mesh->tensor_,
                      world.Split(c.pipeline * shape.data + c.data, c.tensor, named("tp")));
  ZR_ASSIGN_OR_RETURN(mesh->data_,
                      world.Split(c.pipeline * shape.tensor + c.tensor, c.data, named("dp")));
  ZR_ASSIGN_OR_RETURN(mesh->pipeline_,
                      world.Split(c.data * shape.tensor + c.tensor, c.pipeline, named("pp")));
  ZR_ASSIGN_OR_RETURN(mesh->model_parallel_,
                      world.Split(c.data, c.pipeline * shape.tensor + c.tensor, named("mp")));
  // The first and last stage of each pipeline (Megatron's embedding group), when there are two.
  const bool ends = shape.pipeline > 1 && (c.pipeline == 0 || c.pipeline == shape.pipeline - 1);
  ZR_ASSIGN_OR_RETURN(
      mesh->embedding_,
      world.Split(ends ? c.data * shape.tensor + c.tensor : kNoColor, c.pipeline, named("emb")));
  return mesh;
}

}  // namespace zerort
