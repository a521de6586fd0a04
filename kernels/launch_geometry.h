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

// [Note: column sums]
// LayerNorm's weight and bias gradients, RMSNorm's weight gradient and a linear layer's bias
// gradient (where cuBLASLt's BGRADB does not take it) are column sums over every row of the
// micro-batch (8192 rows of 768 for GPT-2 124M at 8 x 1024). The column kernels before 2026-11-30
// gave them 96 blocks of 8-column tiles there, each thread 256 rows one 2-byte load after another:
// latency-bound (about 0.4 TB/s by a count of the loads in flight). Now a partials pass and a
// finish. The partials' grid is column tiles x row chunks: block (tile, chunk) owns 32 x width
// adjacent columns (width 8 where the rows are whole 16-byte vectors, a lane's 8 columns one
// load; else 1) and a chunk of up to kRowsPerChunk rows; its warp w sums rows w, w + 8, ... of the
// chunk for its lane's columns, the 8 warps' sums are added in order through shared memory, and
// one fp32 partial per (chunk, column) goes to scratch (the cuBLASLt workspace, free between GEMMs
// on the stream: no new memory, nothing for the estimator). The finish adds a column's partials
// into the gradient: a block takes kFinishColumns columns (a lane each), its warp w the chunks
// w, w + 8, ... in order, and the 8 warps' sums are added in order through shared memory (one
// thread a column walking every chunk waited on each load in turn: 128 chunks of dependent loads
// at GPT-2's shape). Every order fixed: deterministic, no atomics.
// The norms' backward with an input gradient too (the model's case) is one pass over the rows
// and the finish: block c of NormBackwardKernel (kernels/cuda/norm_backward.cuh) first takes its
// chunk's rows a warp a row for the input gradient, then the chunk's column tiles one after
// another as the partials' blocks (tile, c) would, reading again from the cache the rows it has
// just read. So dout and inp come from memory once, not twice, and the norms' backward takes two
// launches, not three. Its chunks are kFusedRowsPerChunk rows: one block now does every tile of
// a chunk, and a quarter of the rows keeps as many blocks in flight (256 for GPT-2's 8192 rows).
inline constexpr int kWarpsPerBlock = kThreads / kWarp;
inline constexpr int64_t kRowsPerChunk = 64;
inline constexpr int64_t kFusedRowsPerChunk = 32;
inline constexpr int kFinishColumns = kWarp;
inline constexpr int64_t kMaxGridY = 65535;  // gridDim.y's limit
struct ColumnSums {
  int64_t tiles = 1;           // column tiles of 32 x width
  int64_t chunks = 1;          // row chunks (gridDim.y)
  int64_t rows_per_chunk = 1;  // chunk c: rows [c rows_per_chunk, (c + 1) rows_per_chunk)
};
// `max_partials`: the fp32 values the scratch holds; the partials take `sums` (2 with a bias, 1
// without) x chunks x cols of them, so the chunks grow past `rows_per_chunk` where they would not
// fit. cols x sums must fit max_partials (the launcher checks).
constexpr ColumnSums ColumnSumsFor(int64_t rows, int64_t cols, int width, int sums,
                                   int64_t max_partials, int64_t rows_per_chunk = kRowsPerChunk) {
  ColumnSums p;
  const int64_t tile = int64_t{kWarp} * width;
  p.tiles = cols / tile + (cols % tile != 0 ? 1 : 0);
  if (p.tiles < 1) p.tiles = 1;
  int64_t chunks = rows / rows_per_chunk + (rows % rows_per_chunk != 0 ? 1 : 0);
  const int64_t fit = cols * sums > 0 ? max_partials / (cols * sums) : kMaxGridY;
  if (chunks > fit) chunks = fit;
  if (chunks > kMaxGridY) chunks = kMaxGridY;
  if (chunks < 1) chunks = 1;
  p.rows_per_chunk = rows / chunks + (rows % chunks != 0 ? 1 : 0);
  if (p.rows_per_chunk < 1) p.rows_per_chunk = 1;
  p.chunks = rows / p.rows_per_chunk + (rows % p.rows_per_chunk != 0 ? 1 : 0);
  if (p.chunks < 1) p.chunks = 1;
  return p;
}
// The finish's blocks: kFinishColumns columns each.
constexpr int64_t ColumnFinishBlocks(int64_t cols) {
  const int64_t want = cols / kFinishColumns + (cols % kFinishColumns != 0 ? 1 : 0);
  return want < 1 ? 1 : want;
}

}  // namespace zerort::launch
