// The mesh of a `zerort train` run: the world split into data x tensor x pipeline (Megatron's
// order, tensor fastest) with, for hybrid sharding, shard and replicate groups of the data
// dimension ([Note: hybrid sharding], runtime/device_mesh.h), every size checked against the world
// and the model first, naming the key.
#pragma once

#include <memory>
#include <string>

#include "zerort/config/config.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/topology.h"

namespace zerort {

// Null when the world is one data-parallel group and nothing splits it (no tensor or pipeline
// parallelism, no hybrid sharding). `world_source` says where the world's size came from, for
// the messages; `topology` (may be null) which ranks share a node.
StatusOr<std::unique_ptr<DeviceMesh>> MakeRunMesh(const RunConfig& c, Communicator& world,
                                                  const std::string& world_source,
                                                  const Topology* topology);

// One line for the run's log when the data dimension is more than one flat group: the nodes, HSDP's
// shard groups, ZeRO++'s hpZ, qwZ and qgZ. "" otherwise.
std::string DescribeDataLayout(const RunConfig& c, const Topology* topology);

}  // namespace zerort
