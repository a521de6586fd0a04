#include "sharding/reuse_distance.h"

#include "runtime/status.h"

namespace zerort {

std::vector<int64_t> ReuseDistances(std::span<const int> order,
                                    std::span<const int64_t> gathered_numel) {
  std::vector<int64_t> out(order.size(), -1);
  std::vector<char> seen(gathered_numel.size(), 0);
  std::vector<int> touched;
  for (size_t p = 0; p < order.size(); ++p) {
    ZR_CHECK(order[p] >= 0 && static_cast<size_t>(order[p]) < gathered_numel.size())
        << "unit " << order[p] << " at position " << p << " of " << gathered_numel.size()
        << " units";
  }
  for (size_t p = 0; p < order.size(); ++p) {
    const int unit = order[p];
    int64_t distance = 0;
    for (size_t q = p + 1; q < order.size(); ++q) {
      const int other = order[q];
      if (other == unit) {
        out[p] = distance;
        break;
      }
      if (!seen[other]) {
        seen[other] = 1;
        touched.push_back(other);
        distance += gathered_numel[other];
      }
    }
    for (int t : touched) seen[t] = 0;
    touched.clear();
  }
  return out;
}

}  // namespace zerort
