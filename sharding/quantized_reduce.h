// QuantizedReduceScatter: ZeRO++'s qgZ, the gradient reduce-scatter sent as int8, hierarchically.
//
// [Note: qgZ]
// The shard group's S = N x L ranks are N nodes of L (`intra`: this rank's node, `inter`: the
// ranks of its local index on every node; balanced, as DeviceMesh forms them). Rank (n, l) owns
// block (n, l) of the rank-major input (S blocks of `count` fp32 elements). Two all-to-alls, each a
// ring of SendRecv (every backend, queued CPU streams included), each chunk block-quantized to int8
// with fp32 scales ([Note: block quantization], kernels/quantize.h) on the way out and dequantized
// and summed in fp32 on the way in:
//   1. inside the node: to local peer l' goes the chunk of the N blocks local index l' owns on
//   every
//      node (n' = 0..N-1); each rank sums its node's chunks for its local index (its own exactly);
//   2. across nodes: to inter peer n' goes the node-partial sum of block (n', l); each rank sums
//   the
//      N partial sums of its own block (its node's exactly).
// Bytes per rank: (L-1) x (N s + 4 groups) inside the node and (N-1) x (s + 4 groups) across,
// against the fp32 reduce-scatter's (S-1) x 4 s: about a quarter on each link. Each element is
// quantized at most twice (once per level), so the result differs from the exact sum by at most
// half a quantization step of each chunk it went through. Every block is summed by one rank only,
// in a fixed order, so a run is deterministic. With one node (no `inter`) only step 1 runs.
#pragma once

#include <cstdint>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"
#include "zerort/sharding/reduce_plan.h"

namespace zerort {

class QuantizedReduceScatter {
 public:
  // `group` is the shard group; `intra` x `inter` must partition it (inter may be null: one node).
  // Buffers come from `memory`; `host_stream` runs the one host all-gather of the rank map.
  QuantizedReduceScatter(Communicator& group, Communicator& intra, Communicator* inter,
                         Allocator& memory, Stream& host_stream);

  // `in`: group.size() blocks of `count` fp32 elements, rank-major; `out`: this rank's block of
  // their sum (kSum) or mean (kAvg). On `stream` (the comm stream).
  Status Run(const float* in, float* out, int64_t count, ReduceOp op, Stream* stream);

 private:
  Status MapRanks();  // (local, node) of every group rank, once
  // One ring all-to-all level: chunk[k] (k = 0..peers-1, `level.numel` elements each) quantized to
  // peer k, and every peer's chunk for this rank dequantized and added into `acc` (which holds this
  // rank's own chunk already).
  Status Level(Communicator& peers, const std::vector<const float*>& chunk,
               const QgzPlan::Level& level, float* acc, Stream* stream);

  Communicator& group_;
  Communicator& intra_;
  Communicator* inter_;
  Allocator& memory_;
  Stream& host_stream_;
  std::vector<int> block_of_;  // [node x L + local] -> the group rank that owns that block
};

}  // namespace zerort
