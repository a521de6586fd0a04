// [Note: the reduce plan] (reduce_plan.h).
#include "zerort/sharding/reduce_plan.h"

#include "zerort/kernels/quantize.h"

namespace zerort {
namespace {

ReducePlan Sum(std::span<const ReduceSizes> units) {
  ReducePlan p;
  for (const ReduceSizes& u : units) {
    p.total += u.padded;
    p.shards += u.shard;
  }
  return p;
}

}  // namespace

ReducePlan PlanReduceScatter(std::span<const ReduceSizes> units, ReduceGroups groups,
                             bool reduce_scatter, bool quantized) {
  if (units.empty()) return {};
  if (groups.shard_ranks > 1 && !reduce_scatter) return PlanAllReduce(units, groups);
  ReducePlan p = Sum(units);
  if (groups.shard_ranks == 1) {
    p.path = ReducePlan::Path::kAddShards;
    if (groups.replicas > 1) p.replica_count = p.shards;
    return p;
  }
  p.path = quantized ? ReducePlan::Path::kQuantized : ReducePlan::Path::kReduceScatter;
  if (units.size() > 1) p.packed = p.shards * groups.shard_ranks;
  p.reduced = p.shards;
  p.group_op = CollectiveOp::kReduceScatter;
  if (!quantized) p.group_count = p.shards;
  if (groups.replicas > 1) p.replica_count = p.shards;
  return p;
}

ReducePlan PlanAllReduce(std::span<const ReduceSizes> units, ReduceGroups groups) {
  if (units.empty() || groups.shard_ranks * groups.replicas == 1) return {};
  ReducePlan p = Sum(units);
  p.path = ReducePlan::Path::kAllReduce;
  const bool several = units.size() > 1;
  if (several) p.packed = p.total;
  if (groups.shard_ranks > 1) p.group_count = p.total;
  if (groups.replicas > 1) {
    if (several) p.replica_shards = p.shards;
    p.replica_count = p.shards;
  }
  return p;
}

QgzPlan PlanQgz(int64_t count, int nodes, int local) {
  auto level = [](int peers, int64_t numel) {
    if (peers <= 1) return QgzPlan::Level{};
    return QgzPlan::Level{peers, numel, QuantizedBytes(numel)};
  };
  return {.packed = count * nodes * local,
          .partial = count * nodes,
          .intra = level(local, count * nodes),
          .inter = level(nodes, count)};
}

}  // namespace zerort
