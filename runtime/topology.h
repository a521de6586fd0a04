// Topology: which world ranks share a node, for the groups that keep traffic inside a node
// (DeviceMesh's intra- and inter-node data groups) and for counting the bytes that cross nodes.
//
// [Note: nodes]
// A node is a set of ranks that reach each other over the fast link (NVLink, shared memory);
// between nodes is the slow one (InfiniBand, Ethernet). Session learns it at start: every rank's
// hostname is all-gathered over the world, and ranks with the same hostname are one node. Nodes
// are numbered in the order of their lowest world rank. The launcher's local rank and size must
// agree with it (a rank's local rank is its index among its node's ranks), or the start fails
// naming both: a launcher that places ranks round-robin (mpirun --map-by node) is fine, one that
// says otherwise than the hostnames is a misconfigured job.
// The environment variable ZERORT_RANKS_PER_NODE=k overrides it, splitting one machine into
// simulated nodes for tests: ranks 0..k-1 are node 0, k..2k-1 node 1, and so on (k must divide
// the world size; a simulated node may not span two real ones).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/status.h"

namespace zerort {

inline constexpr char kRanksPerNodeVar[] = "ZERORT_RANKS_PER_NODE";

struct Topology {
  std::vector<int> node_of_rank;        // world rank -> node index
  std::vector<std::string> node_names;  // per node: its hostname, or "sim<n>" when simulated
  std::string source;                   // "hostnames", "ZERORT_RANKS_PER_NODE=2", "one process"

  int world_size() const { return static_cast<int>(node_of_rank.size()); }
  int nodes() const { return static_cast<int>(node_names.size()); }
  int node(int world_rank) const { return node_of_rank.at(static_cast<size_t>(world_rank)); }
  // True when every one of `world_ranks` is on one node.
  bool OneNode(std::span<const int> world_ranks) const;
  // World ranks of `node`, ascending.
  std::vector<int> RanksOf(int node) const;
  // "2 nodes x 2 ranks (ZERORT_RANKS_PER_NODE=2)"; "3 nodes of 4, 4, 2 ranks (hostnames)".
  std::string Describe() const;
};

// Every rank on one node.
Topology SingleNode(int world_size, const std::string& host);
// Ranks with the same hostname share a node (hosts[r]: rank r's).
Topology TopologyFromHosts(std::span<const std::string> hosts);
// ZERORT_RANKS_PER_NODE, when set: a positive integer, else InvalidArgument naming the variable.
StatusOr<std::optional<int>> RanksPerNodeOverride(const EnvLookup& env);
// `real` split into simulated nodes of `ranks_per_node` consecutive ranks; fails when it does not
// divide the world or a simulated node would span two real nodes.
StatusOr<Topology> SimulatedTopology(const Topology& real, int ranks_per_node);
// ZERORT_RANKS_PER_NODE is absent, or valid for `world_size` ranks on one host: for a command's
// usage check before it starts (the hosts are known only once the ranks run).
Status CheckRanksPerNodeOverride(const EnvLookup& env, int world_size);
// The launcher's local rank and size for `rank` agree with `topology` (Note: nodes).
Status CheckLaunchAgrees(const Topology& topology, const LaunchEnv& launch);
// This machine's hostname ("localhost" when it has none).
std::string HostName();

}  // namespace zerort
