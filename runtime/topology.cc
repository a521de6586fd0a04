// Topology from hostnames or ZERORT_RANKS_PER_NODE ([Note: nodes] in topology.h).
#include "zerort/runtime/topology.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "zerort/runtime/strings.h"

namespace zerort {

bool Topology::OneNode(std::span<const int> world_ranks) const {
  return std::all_of(world_ranks.begin(), world_ranks.end(),
                     [&](int r) { return node(r) == node(world_ranks.front()); });
}

std::vector<int> Topology::RanksOf(int n) const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r) {
    if (node(r) == n) ranks.push_back(r);
  }
  return ranks;
}

std::string Topology::Describe() const {
  std::vector<size_t> sizes;
  for (int n = 0; n < nodes(); ++n) sizes.push_back(RanksOf(n).size());
  const bool even =
      std::all_of(sizes.begin(), sizes.end(), [&](size_t s) { return s == sizes[0]; });
  std::string shape;
  if (even) {
    shape = StrCat(nodes(), nodes() == 1 ? " node x " : " nodes x ", sizes.empty() ? 0 : sizes[0],
                   sizes.size() == 1 && sizes[0] == 1 ? " rank" : " ranks");
  } else {
    shape = StrCat(nodes(), " nodes of ");
    for (size_t i = 0; i < sizes.size(); ++i) shape += StrCat(i ? ", " : "", sizes[i]);
    shape += " ranks";
  }
  return StrCat(shape, " (", source, ")");
}

Topology SingleNode(int world_size, const std::string& host) {
  return {std::vector<int>(static_cast<size_t>(world_size), 0), {host}, "one node"};
}

Topology TopologyFromHosts(std::span<const std::string> hosts) {
  Topology t;
  t.source = "hostnames";
  std::map<std::string, int, std::less<>> index;
  for (const std::string& host : hosts) {
    auto [it, added] = index.emplace(host, t.nodes());
    if (added) t.node_names.push_back(host);
    t.node_of_rank.push_back(it->second);
  }
  return t;
}

StatusOr<std::optional<int>> RanksPerNodeOverride(const EnvLookup& env) {
  const std::optional<std::string> value = env(kRanksPerNodeVar);
  if (!value.has_value()) return std::optional<int>();
  int k = 0;
  if (!absl::SimpleAtoi(*value, &k) || k < 1) {
    return absl::InvalidArgumentError(
        StrCat(kRanksPerNodeVar, "='", *value, "' is not a positive integer (ranks per node)"));
  }
  return std::optional<int>(k);
}

StatusOr<Topology> SimulatedTopology(const Topology& real, int k) {
  const int world = real.world_size();
  if (k < 1 || world % k != 0) {
    return absl::InvalidArgumentError(StrCat(kRanksPerNodeVar, "=", k,
                                             " does not divide the world size ", world,
                                             " (ranks 0..k-1 are node 0, and so on)"));
  }
  Topology t;
  t.source = StrCat(kRanksPerNodeVar, "=", k);
  for (int r = 0; r < world; ++r) {
    const int node = r / k;
    if (node == t.nodes()) t.node_names.push_back(StrCat("sim", node));
    if (real.node(r) != real.node(node * k)) {
      return absl::InvalidArgumentError(
          StrCat(kRanksPerNodeVar, "=", k, " puts ranks ", node * k, " and ", r,
                 " on one simulated node, but they run on different hosts (",
                 real.node_names[real.node(node * k)], ", ", real.node_names[real.node(r)], ")"));
    }
    t.node_of_rank.push_back(node);
  }
  return t;
}

Status CheckRanksPerNodeOverride(const EnvLookup& env, int world_size) {
  ZR_ASSIGN_OR_RETURN(const std::optional<int> k, RanksPerNodeOverride(env));
  if (!k.has_value()) return absl::OkStatus();
  return SimulatedTopology(SingleNode(world_size, "localhost"), *k).status();
}

Status CheckLaunchAgrees(const Topology& topology, const LaunchEnv& launch) {
  if (!launch.local_known || topology.world_size() <= launch.rank) return absl::OkStatus();
  const std::vector<int> mine = topology.RanksOf(topology.node(launch.rank));
  const int local =
      static_cast<int>(std::find(mine.begin(), mine.end(), launch.rank) - mine.begin());
  if (launch.local_world_size != static_cast<int>(mine.size())) {
    return absl::InvalidArgumentError(
        StrCat("the ", launch.source, " launcher says rank ", launch.rank, " shares its node with ",
               launch.local_world_size, " ranks, but ", mine.size(), " ranks run on host ",
               topology.node_names[topology.node(launch.rank)], " (", topology.source, ")"));
  }
  if (launch.local_rank != local) {
    return absl::InvalidArgumentError(StrCat("the ", launch.source, " launcher gives rank ",
                                             launch.rank, " local rank ", launch.local_rank,
                                             ", but it is rank ", local, " of its host's ranks (",
                                             topology.source, ")"));
  }
  return absl::OkStatus();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace zerort
