// The CUDA kernels' launch geometry: how many blocks each kind of kernel is given. Host code, so
// the CPU tests check it (tests/kernels/launch_geometry_test.cc: every element or row gets a
// thread, no grid is 0 or past the hardware's limit, the column kernels' tiles cover every column).
// The thread indexing inside the kernels stays CUDA-only (kernels/README.md).
#pragma once

#include <cstdint>

namespace zerort::launch {

inline constexpr int kThreads = 256;  // threads per block of every zerort kernel
inline constexpr int kWarp = 32;
inline constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;  // gridDim.x's limit

// Blocks of a grid-stride loop over n elements: one thread per element up to `max_blocks`
// blocks (the loop covers the rest), and at least one block, so n = 0 is a launch that does
// nothing rather than an invalid configuration (a grid of 0).
constexpr int GridStrideBlocks(int64_t n, int64_t max_blocks, int threads = kThreads) {
  const int64_t want = n / threads + (n % threads != 0 ? 1 : 0);
  return static_cast<int>(want < 1 ? 1 : (want > max_blocks ? max_blocks : want));
}

// Blocks of a warp-per-row kernel (no grid-stride loop: every row gets its own warp; rows past
// the end return at once, so 0 rows is one idle block).
constexpr int64_t WarpPerRowBlocks(int64_t rows, int threads = kThreads) {
  const int64_t warps_per_block = threads / kWarp;
  const int64_t want = rows / warps_per_block + (rows % warps_per_block != 0 ? 1 : 0);
  return want < 1 ? 1 : want;
}

// The column kernels (a bias gradient, LayerNorm's weight and bias gradients): each block owns
// kColumnTile adjacent columns and all rows; its threads are kColumnTile columns x
// kThreads / kColumnTile row phases (thread (c, p) sums rows p, p + phases, ...), and the phases'
// sums are added in a fixed order. A warp reads 4 rows x 8 adjacent columns, one 32-byte sector
// per row in fp32: coalesced, deterministic, no atomics, no scratch.
inline constexpr int kColumnTile = 8;
inline constexpr int kRowPhases = kThreads / kColumnTile;
constexpr int64_t ColumnBlocks(int64_t cols) {
  const int64_t want = cols / kColumnTile + (cols % kColumnTile != 0 ? 1 : 0);
  return want < 1 ? 1 : want;
}

}  // namespace zerort::launch
