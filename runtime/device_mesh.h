// The device mesh: world ranks arranged as pipeline x data x tensor, tensor-parallel ranks
// adjacent (fastest), then data, then pipeline, as Megatron-LM orders them:
//   rank = (pipeline * data_size + data) * tensor_size + tensor
// Each rank gets its process groups (data, tensor, pipeline, model-parallel and, on a pipeline's
// first and last stage, embedding), split from the world and handed out explicitly.
#pragma once

#include <memory>

#include "runtime/communicator.h"

namespace zerort {

struct MeshShape {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int world_size() const { return data * tensor * pipeline; }
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
  // Collective over `world`; fails unless shape.world_size() == world.size().
  static StatusOr<std::unique_ptr<DeviceMesh>> Create(Communicator& world, MeshShape shape,
                                                      const CommOptions& options);

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
};

}  // namespace zerort
