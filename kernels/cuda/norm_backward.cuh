// LayerNorm's and RMSNorm's backward with the input gradient and the weight (and bias) gradients
// in one pass over the rows ([Note: column sums], kernels/launch_geometry.h). Internal to
// kernels/cuda/, included by model_kernels.cu after model_ops.cuh and llama_ops.cuh, whose row
// and column functions it runs: the same arithmetic, in the same order, as the separate kernels.
#pragma once

#include "zerort/kernels/cuda/llama_ops.cuh"
#include "zerort/kernels/cuda/model_ops.cuh"

namespace zerort {
namespace {

// Block `chunk` of ColumnSumsFor(rows, channels, W, sums, ..., kFusedRowsPerChunk): the input
// gradient of the chunk's rows (warp w: rows w, w + kWarpsPerBlock, ...), then the column
// partials of each of the `tiles` column tiles over the same rows, read again from the cache.
// kKind: kLayerNorm (mean used, pb written) or kRms. No barrier between the passes: the first
// touches no shared memory, and the second reads dout and inp only, which dinp does not overlap
// (ModelKernels' contract), so another warp's rows may still be in their first pass.
template <ColumnSum kKind, typename T, int W>
static __global__ void __launch_bounds__(kThreads)
    NormBackwardKernel(T* dinp, float* pw, float* pb, const T* dout, const T* inp, const T* w,
                       const float* mean, const float* rstd, int64_t rows, int channels,
                       int64_t rows_per_chunk, int64_t tiles) {
  static_assert(kKind != ColumnSum::kBias, "NormBackwardKernel: a norm's backward");
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t chunk = blockIdx.x;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  for (int64_t row = r0 + warp; row < r1; row += launch::kWarpsPerBlock) {
    if constexpr (kKind == ColumnSum::kLayerNorm) {
      LayerNormInputGradRow<T, W>(dinp, dout, inp, w, mean[row], rstd[row], row, channels, lane);
    } else {
      RmsNormInputGradRow<T, W>(dinp, dout, inp, w, rstd[row], row, channels, lane);
    }
  }
  for (int64_t tile = 0; tile < tiles; ++tile) {
    ColumnPartialsTile<kKind, T, W>(pw, pb, dout, inp, mean, rstd, rows, channels, rows_per_chunk,
                                    tile, chunk);
  }
}

}  // namespace
}  // namespace zerort
