// The estimator's communication per step: the bytes one rank sends within a node and across
// nodes, counted by the memory model where it replays each collective the shard manager issues.
//
// [Note: bytes per step]
// The memory model (step_model.cc) replays a steady-state step as the runtime runs it: every
// stage-3 gather the gather planner decides, every reduce-scatter bucket, the stage 0-1
// all-reduces, the stage 1-2 gathers of updated parameters, and with hybrid sharding the
// all-reduce of each reduced shard across the replicas. Each adds its RingBytesSent ([Note: bytes
// on the wire], runtime/communicator.h) to the link its group uses: across nodes when the group's
// ranks span nodes, with ranks placed node by node in Megatron's order (tensor fastest, then
// data, then pipeline). That is what a run measures (metrics.jsonl's comm_bytes_*), less the
// step's scalar all-reduces (loss, norm, overflow, stop flag: tens of bytes each) and the tensor-
// and pipeline-parallel traffic of activations, which the model does not count.
// A time is bytes / bandwidth per link, the two links in sequence (no overlap with compute or
// with each other): an upper bound on the exposed communication, and a ranking of layouts.
#pragma once

#include <cstdint>

#include "zerort/runtime/collective_trace.h"

namespace zerort {

struct StepComm {
  int64_t intra = 0;  // bytes this rank sends per step in groups within one node
  int64_t inter = 0;  // and in groups that span nodes

  // One collective over `ranks` ranks of `bytes` in all (an all-gather's or reduce-scatter's
  // whole buffer, an all-reduce's buffer): its RingBytesSent.
  void Add(CollectiveOp op, int64_t bytes, int ranks, bool crosses);
  // Seconds at these link speeds (gigabits per second; 0: that link is not counted).
  double Seconds(double intra_gbps, double inter_gbps) const;
};

// Whether a group of `size` ranks whose world ranks are first, first + stride, ... spans nodes
// of `ranks_per_node` consecutive world ranks.
bool SpansNodes(int first, int stride, int size, int ranks_per_node);

}  // namespace zerort
