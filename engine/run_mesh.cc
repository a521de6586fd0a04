// The run's mesh from parallel.* (run_mesh.h).
#include "zerort/engine/run_mesh.h"

#include "absl/strings/str_join.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<std::unique_ptr<DeviceMesh>> MakeRunMesh(const RunConfig& c, Communicator& world,
                                                  const std::string& world_source,
                                                  const Topology* topology) {
  const int tp = c.parallel.tensor_parallel_size;
  const int pp = c.parallel.pipeline_parallel_size;
  const int shard = c.parallel.data_shard_size;
  const int world_size = world.size();
  if (pp == 1 && world_size % tp != 0) {
    return absl::InvalidArgumentError(StrCat("parallel.tensor_parallel_size = ", tp,
                                             " does not divide the world size ", world_size, " (",
                                             world_source, ")"));
  }
  if (world_size % (tp * pp) != 0) {
    return absl::InvalidArgumentError(
        StrCat("parallel.tensor_parallel_size x pipeline_parallel_size = ", tp, " x ", pp,
               " does not divide the world size ", world_size, " (", world_source, ")"));
  }
  const DecoderConfig& m = c.model.shape;
  if (m.n_head % tp != 0) {
    return absl::InvalidArgumentError(StrCat("parallel.tensor_parallel_size = ", tp,
                                             " does not divide model.n_head = ", m.n_head));
  }
  if (m.d_model % tp != 0) {
    return absl::InvalidArgumentError(StrCat("parallel.tensor_parallel_size = ", tp,
                                             " does not divide model.d_model = ", m.d_model));
  }
  const int dp = world_size / (tp * pp);
  const std::string key =
      c.zero.mics_shard_size > 0 ? "zero_optimization.mics_shard_size" : "parallel.data_shard_size";
  if (shard > 0 && dp % shard != 0) {
    return absl::InvalidArgumentError(StrCat(
        key, " = ", shard, " does not divide the data-parallel size ", dp, " (", world_source,
        " / (tensor_parallel_size ", tp, " x pipeline_parallel_size ", pp, "))"));
  }
  const bool hybrid = shard > 0 && shard < dp;
  const int hpz = c.manager.hpz_partition_size;
  if (hpz > 1 && (hybrid ? shard : dp) % hpz != 0) {
    return absl::InvalidArgumentError(
        StrCat("zero_optimization.zero_hpz_partition_size = ", hpz, " does not divide the ",
               hybrid ? StrCat(key, " ", shard) : StrCat("data-parallel size ", dp), " (",
               world_source, ")"));
  }
  // qgZ's two levels are the data group's intra- and inter-node groups.
  if (tp == 1 && pp == 1 && !hybrid && hpz <= 1 && !c.manager.quantized_gradients) {
    return std::unique_ptr<DeviceMesh>();
  }
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMesh> mesh,
                      DeviceMesh::Create(world,
                                         {.data = dp,
                                          .tensor = tp,
                                          .pipeline = pp,
                                          .data_shard = hybrid ? shard : 0,
                                          .data_secondary = hpz > 1 ? hpz : 0},
                                         world.options(), topology));
  if (hybrid && mesh->data_shard().options().crosses_nodes && world.rank() == 0) {
    Logger()->warn(
        "{} = {}: a shard group spans nodes ({}), so every gather crosses them; a group within a "
        "node keeps the gathers there",
        key, shard, topology != nullptr ? topology->Describe() : std::string("one node"));
  }
  if (hpz > 1 && mesh->data_secondary()->options().crosses_nodes && world.rank() == 0) {
    Logger()->warn(
        "zero_optimization.zero_hpz_partition_size = {}: an hpZ group spans nodes ({}), so the "
        "backward's gathers cross them too; set it to the ranks per node",
        hpz, topology != nullptr ? topology->Describe() : std::string("one node"));
  }
  return mesh;
}

std::string DescribeDataLayout(const RunConfig& c, const Topology* topology) {
  std::vector<std::string> parts;
  if (topology != nullptr && topology->nodes() > 1) parts.push_back(topology->Describe());
  if (c.parallel.data_shard_size > 0) {
    parts.push_back(StrCat("state sharded in groups of ", c.parallel.data_shard_size,
                           " data ranks (hybrid sharding)"));
  }
  if (c.manager.hpz_partition_size > 1) {
    parts.push_back(StrCat("hpZ secondary copy over ", c.manager.hpz_partition_size, " ranks"));
  }
  if (c.manager.quantized_weights) parts.push_back("qwZ int8 weight gathers");
  if (c.manager.quantized_gradients) parts.push_back("qgZ int8 gradient reduce-scatter");
  return absl::StrJoin(parts, "; ");
}

}  // namespace zerort
