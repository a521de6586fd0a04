// [Note: blending token files]
// Megatron's BlendedDataset as a pure function: training sequence g of a blend of D token files
// with weights w_d (normalised to sum 1) is file d's sequence k, where
//   - sequences come in blocks of kBlock = 65536; before block b, file d has had c_d(b kBlock)
//     sequences: floor(n w_d), plus one for the n - sum floor(n w_d) files with the largest
//     remainders (ties: the lower index), so the counts add up to n exactly;
//   - inside a block, each position goes to the file whose count lags its share most (Megatron's
//     rule: the largest w_d (n + 1) - count_d; ties: the lower index) among the files that still
//     have sequences left of their block quota c_d((b + 1) kBlock) - c_d(b kBlock);
//   - k is the count of file d's sequences before g.
// So any g is found without walking from 0 (a resumed run at sequence 10^9 costs one block), the
// first n sequences hold each file's share to within 1 + one block's rounding, and each file is
// read in its own order (its sequence k is its own window k: data_loader.h). A quota is never
// negative when every weight is at least 2 / kBlock (Create refuses smaller ones).
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

class BlendIndex {
 public:
  static constexpr int64_t kBlock = 65536;
  // `weights` positive and finite (they are normalised); each at least 2 / kBlock of the sum.
  static StatusOr<BlendIndex> Create(std::vector<double> weights);
  BlendIndex(BlendIndex&& other) noexcept;

  int parts() const { return static_cast<int>(w_.size()); }
  double weight(int d) const { return w_[d]; }
  // (file d, its sequence k) for blend sequence g >= 0.
  std::pair<int, int64_t> At(int64_t g) const;
  // How many of the first n sequences go to each file (c_d(n) above at block boundaries;
  // exact for any n).
  std::vector<int64_t> CountsBefore(int64_t n) const;

 private:
  explicit BlendIndex(std::vector<double> w) : w_(std::move(w)) {}
  std::vector<int64_t> BoundaryCounts(int64_t n) const;  // n a multiple of kBlock
  void FillBlock(int64_t block) const;                   // with mu_ held

  std::vector<double> w_;
  // The last block asked for: each position's file and its sequence there.
  mutable std::mutex mu_;
  mutable int64_t block_ = -1;
  mutable std::vector<uint16_t> part_;
  mutable std::vector<int64_t> index_;
};

}  // namespace zerort
