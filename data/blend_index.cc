// Blended token files ([Note: blending token files], blend_index.h).
#include "zerort/data/blend_index.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<BlendIndex> BlendIndex::Create(std::vector<double> weights) {
  if (weights.empty() || weights.size() > 1024) {
    return absl::InvalidArgumentError(StrCat("a blend of ", weights.size(), " files (1 to 1024)"));
  }
  double sum = 0;
  for (double w : weights) {
    if (!(w > 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(StrCat("blend weight ", w, ": must be positive"));
    }
    sum += w;
  }
  for (size_t d = 0; d < weights.size(); ++d) {
    weights[d] /= sum;
    if (weights[d] < 2.0 / kBlock) {
      return absl::InvalidArgumentError(StrCat("blend weight of file ", d, " is ", weights[d],
                                               " of the total: at least 2/", kBlock, " (",
                                               2.0 / kBlock, ") is needed, or leave the file out"));
    }
  }
  return BlendIndex(std::move(weights));
}

BlendIndex::BlendIndex(BlendIndex&& other) noexcept
    : w_(std::move(other.w_)),
      block_(other.block_),
      part_(std::move(other.part_)),
      index_(std::move(other.index_)) {}

std::vector<int64_t> BlendIndex::BoundaryCounts(int64_t n) const {
  const size_t D = w_.size();
  std::vector<int64_t> c(D);
  std::vector<double> rem(D);
  int64_t given = 0;
  for (size_t d = 0; d < D; ++d) {
    const double share = static_cast<double>(n) * w_[d];
    c[d] = static_cast<int64_t>(std::floor(share));
    rem[d] = share - static_cast<double>(c[d]);
    given += c[d];
  }
  // Largest remainders first (ties: the lower index) take the rest; a rounding surplus is
  // taken back from the smallest remainders.
  std::vector<size_t> order(D);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rem[a] > rem[b]; });
  for (size_t i = 0; given < n; ++i) {
    ++c[order[i % D]];
    ++given;
  }
  for (size_t i = D; given > n; --i) {
    --c[order[(i - 1) % D]];
    --given;
  }
  return c;
}

void BlendIndex::FillBlock(int64_t block) const {
  const size_t D = w_.size();
  const int64_t n0 = block * kBlock;
  const std::vector<int64_t> start = BoundaryCounts(n0), end = BoundaryCounts(n0 + kBlock);
  std::vector<int64_t> count = start, quota(D);
  for (size_t d = 0; d < D; ++d) {
    quota[d] = end[d] - start[d];
    ZR_CHECK(quota[d] >= 0) << "blend quota " << quota[d] << " of file " << d;
  }
  part_.resize(kBlock);
  index_.resize(kBlock);
  for (int64_t i = 0; i < kBlock; ++i) {
    size_t best = D;
    double best_lag = 0;
    for (size_t d = 0; d < D; ++d) {
      if (quota[d] == 0) continue;
      const double lag = w_[d] * static_cast<double>(n0 + i + 1) - static_cast<double>(count[d]);
      if (best == D || lag > best_lag) {
        best = d;
        best_lag = lag;
      }
    }
    ZR_CHECK(best < D) << "blend block " << block << " ran out of quota at " << i;
    part_[i] = static_cast<uint16_t>(best);
    index_[i] = count[best]++;
    --quota[best];
  }
  block_ = block;
}

std::pair<int, int64_t> BlendIndex::At(int64_t g) const {
  ZR_CHECK(g >= 0) << "blend sequence " << g;
  std::lock_guard lock(mu_);
  if (g / kBlock != block_) FillBlock(g / kBlock);
  const int64_t i = g % kBlock;
  return {part_[i], index_[i]};
}

std::vector<int64_t> BlendIndex::CountsBefore(int64_t n) const {
  std::vector<int64_t> c = BoundaryCounts(n / kBlock * kBlock);
  std::lock_guard lock(mu_);
  if (n % kBlock != 0 && n / kBlock != block_) FillBlock(n / kBlock);
  for (int64_t i = 0; i < n % kBlock; ++i) ++c[part_[i]];
  return c;
}

}  // namespace zerort
