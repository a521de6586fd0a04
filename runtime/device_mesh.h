// The device mesh: world ranks arranged as pipeline x data x tensor, tensor-parallel ranks
// adjacent (fastest), then data, then pipeline, as Megatron-LM orders them:
//   rank = (pipeline * data_size + data) * tensor_size + tensor
// Each rank gets its process groups (data, tensor, pipeline, model-parallel and, on a pipeline's
// first and last stage, embedding), split from the world and handed out explicitly.
//
// [Note: hybrid sharding]
// The data-parallel dimension may be cut in two (PyTorch FSDP's HSDP, DeepSpeed's MiCS): groups
// of `data_shard` consecutive data ranks each shard the model state among themselves (the shard
// group), and the groups replicate each other (the replicate group: the ranks of the same index
// in every shard group). Data ranks stay what they were (each reads its own batch); only which
// ranks hold which shard changes. With ranks placed node by node, a shard group that fits in a
// node keeps every gather inside it, and only gradients cross nodes (sharding/README.md).
//
// With a Topology ([Note: nodes]) the data dimension gets its intra-node group (this data group's
// ranks on this node) and its inter-node group (the ranks of this data group at the same index on
// every node) when every node holds the same number of them: the groups hierarchical collectives
// use. Every group records whether its ranks cross nodes (CommOptions::crosses_nodes).
#pragma once

#include <memory>
#include <string>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/topology.h"

namespace zerort {

struct MeshShape {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int data_shard = 0;  // [Note: hybrid sharding]: ranks per shard group; 0 means `data`
  // ZeRO++ hpZ ([Note: hpZ], sharding/sharded_unit.h): groups of this many consecutive ranks of
  // the shard group; 0 or 1: none.
  int data_secondary = 0;
  int world_size() const { return data * tensor * pipeline; }
  int shard_size() const { return data_shard > 0 ? data_shard : data; }
  int replicas() const { return data / shard_size(); }
};

struct MeshCoord {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
  friend bool operator==(const MeshCoord&, const MeshCoord&) = default;
};

MeshCoord MeshCoordOf(int rank, const MeshShape& shape);
int MeshRankOf(const MeshCoord& coord, const MeshShape& shape);

class DeviceMesh {
 public:
  // Collective over `world`; fails unless shape.world_size() == world.size() and data_shard
  // divides data. `topology` (may be null: one node) says which ranks share a node.
  static StatusOr<std::unique_ptr<DeviceMesh>> Create(Communicator& world, MeshShape shape,
                                                      const CommOptions& options,
                                                      const Topology* topology = nullptr);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  Communicator& world() const { return world_; }
  Communicator& data() const { return *data_; }          // same tensor and pipeline coordinate
  Communicator& tensor() const { return *tensor_; }      // same data and pipeline coordinate
  Communicator& pipeline() const { return *pipeline_; }  // same data and tensor coordinate
  // One model replica: every tensor and pipeline coordinate of this data coordinate (the
  // gradient norm and the overflow decision are agreed over it).
  Communicator& model_parallel() const { return *model_parallel_; }
  // The first and last pipeline stage of this data and tensor coordinate (they both hold the
  // tied embedding); null on the other stages and with one stage.
  Communicator* embedding() const { return embedding_.get(); }
  // [Note: hybrid sharding]: the ranks that shard the model state together (the data group
  // itself without hybrid sharding), and the ranks holding the same shards (null without).
  Communicator& data_shard() const { return data_shard_ ? *data_shard_ : *data_; }
  Communicator* data_replicate() const { return data_replicate_.get(); }
  // hpZ's secondary group (null without): consecutive ranks of the shard group.
  Communicator* data_secondary() const { return data_secondary_.get(); }
  // This data group's ranks on this node, and its ranks at the same index on every node; null
  // without a topology of several nodes, or when the nodes hold different numbers of them.
  Communicator* data_intra() const { return data_intra_.get(); }
  Communicator* data_inter() const { return data_inter_.get(); }
  // One line per group of more than one rank this rank is in: its name, its members (world
  // ranks) and whether they cross nodes.
  std::string DescribeGroups() const;

 private:
  DeviceMesh(Communicator& world, MeshShape shape) : world_(world), shape_(shape) {}
  Communicator& world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<Communicator> tensor_;
  std::unique_ptr<Communicator> pipeline_;
  std::unique_ptr<Communicator> model_parallel_;
  std::unique_ptr<Communicator> embedding_;
  std::unique_ptr<Communicator> data_shard_, data_replicate_, data_secondary_, data_intra_,
      data_inter_;
  std::string groups_;  // DescribeGroups
};

}  // namespace zerort
