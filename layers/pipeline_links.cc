// PipelineLinks: directed links between neighbouring stages ([Note: pipeline links]).
#include "zerort/layers/pipeline_links.h"

#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<PipelineLinks> PipelineLinks::Create(Communicator& pipeline) {
  PipelineLinks links;
  const int p = pipeline.size();
  const int me = pipeline.rank();
  if (p == 1) return links;
  // Edge i joins stages i and i + 1 (mod p); p = 2 has one edge. Each Split round takes edges
  // that share no stage: alternate edges, and a third round for the odd ring's closing edge.
  const int edges = p == 2 ? 1 : p;
  auto round_of = [&](int edge) { return (p % 2 == 1 && edge == p - 1) ? 2 : edge % 2; };
  const int rounds = p == 2 ? 1 : (p % 2 == 1 ? 3 : 2);
  for (int round = 0; round < rounds; ++round) {
    int edge = -1;  // this rank's edge in the round, if any
    for (int e = 0; e < edges; ++e) {
      if (round_of(e) == round && (me == e || me == (e + 1) % p)) edge = e;
    }
    for (const bool up : {true, false}) {  // e -> e + 1, then e + 1 -> e
      const int from = edge < 0 ? -1 : (up ? edge : (edge + 1) % p);
      const int to = edge < 0 ? -1 : (up ? (edge + 1) % p : edge);
      CommOptions options = pipeline.options();
      options.name = StrCat(pipeline.name(), " ", from, "->", to);
      const int key = me == from ? kSenderRank : kReceiverRank;
      ZR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> link,
                          pipeline.Split(edge < 0 ? kNoColor : edge, key, std::move(options)));
      if (edge < 0) continue;
      if (link == nullptr || link->size() != 2 || link->rank() != key) {
        return absl::InternalError(StrCat("pipeline link ", from, "->", to, " of stage ", me,
                                          " was not made as a group of two"));
      }
      (me == from ? links.to_[to] : links.from_[from]) = std::move(link);
    }
  }
  return links;
}

Communicator* PipelineLinks::To(int stage) const {
  auto it = to_.find(stage);
  return it == to_.end() ? nullptr : it->second.get();
}

Communicator* PipelineLinks::From(int stage) const {
  auto it = from_.find(stage);
  return it == from_.end() ? nullptr : it->second.get();
}

namespace {
std::vector<std::pair<int, Communicator*>> Listed(
    const std::map<int, std::unique_ptr<Communicator>>& links) {
  std::vector<std::pair<int, Communicator*>> out;
  for (const auto& [stage, link] : links) out.emplace_back(stage, link.get());
  return out;
}
}  // namespace

std::vector<std::pair<int, Communicator*>> PipelineLinks::outgoing() const { return Listed(to_); }
std::vector<std::pair<int, Communicator*>> PipelineLinks::incoming() const { return Listed(from_); }

}  // namespace zerort
