// [Note: bytes per step] (comm_model.h).
#include "zerort/estimate/comm_model.h"

namespace zerort {

void StepComm::Add(CollectiveOp op, int64_t bytes, int ranks, bool crosses) {
  if (bytes <= 0) return;
  (crosses ? inter : intra) +=
      static_cast<int64_t>(RingBytesSent(op, static_cast<size_t>(bytes), ranks));
}

double StepComm::Seconds(double intra_gbps, double inter_gbps) const {
  double s = 0;
  if (intra_gbps > 0) s += static_cast<double>(intra) * 8 / (intra_gbps * 1e9);
  if (inter_gbps > 0) s += static_cast<double>(inter) * 8 / (inter_gbps * 1e9);
  return s;
}

bool SpansNodes(int first, int stride, int size, int ranks_per_node) {
  if (size <= 1 || ranks_per_node < 1) return false;
  const int64_t last = int64_t{first} + int64_t{stride} * (size - 1);
  return first / ranks_per_node != last / ranks_per_node;
}

}  // namespace zerort
