// Reductions and element-wise helpers over one buffer, for clipping and loss scaling. Each
// accumulates into a one-element fp32 `out` view on the same device (out += ...), so several
// shards sum into one scalar without a host round trip; the caller zeroes it first.
//   SumOfSquares:   out += sum(x^2) (CPU: double partials; CUDA: fp32 per thread, then a tree)
//   CountNonFinite: out += number of inf/NaN elements
//   Sum:            out += factor x sum(x) (a training step's losses, kept on the device)
//   Scale:          x *= factor, in place
//   AccumulateInto: dst (f32) += src (any float dtype), element-wise
//   AssignInto:     dst (f32) = 0 + src: what AccumulateInto gives into a zeroed dst, bitwise
//                   (-0 becomes +0), in one pass that does not read dst
//   HostAccumulateWithSumOfSquares: AccumulateInto or AssignInto, then SumOfSquares over parts
//                   of dst, bitwise, in one pass over host memory (a host gradient's last add)
// CPU (vectorised, with a scalar reference for the tests) and CUDA twins. On CPU data each runs in
// `stream`'s order (RunOnHostInOrder: on a queued CPU stream's thread, else at once).
#pragma once

#include <cstdint>
#include <span>

#include "zerort/runtime/device.h"
#include "zerort/runtime/range.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

Status SumOfSquares(const TensorView& x, const TensorView& out, Stream* stream);
Status CountNonFinite(const TensorView& x, const TensorView& out, Stream* stream);
Status Sum(const TensorView& x, double factor, const TensorView& out, Stream* stream);
Status Scale(const TensorView& x, float factor, Stream* stream);
Status AccumulateInto(const TensorView& src, const TensorView& dst, Stream* stream);
Status AssignInto(const TensorView& src, const TensorView& dst, Stream* stream);

// Host views: the double sum behind SumOfSquares / CountNonFinite, continued from `running`.
// Consecutive pieces of a buffer whose boundaries are multiples of kReduceChunk elements chain to
// exactly the value one call over the whole buffer gives (the sum runs chunk by chunk in order),
// so a buffer streamed from NVMe in pieces has the same norm as one held in memory.
inline constexpr int64_t kReduceChunk = int64_t{1} << 16;
double HostSumOfSquares(const TensorView& x, double running);
double HostCountNonFinite(const TensorView& x, double running);

// A host fp32 gradient shard's last add and its norm part in one pass: dst += src (dst = 0 + src
// when `assign`), then the sum of squares of dst over each of `ranges` (in order, disjoint,
// inside dst), added into a float from 0 range by range. Bitwise what AccumulateInto (AssignInto)
// followed by SumOfSquares over each range gives (the same chunks, the same lanes), each value
// squared as it is written: 4 bytes an element less memory traffic than the two passes. Runs at
// once (host data only).
StatusOr<float> HostAccumulateWithSumOfSquares(const TensorView& src, const TensorView& dst,
                                               bool assign, std::span<const Range> ranges);

// Scalar references (CPU): double accumulation.
double SumOfSquaresReference(const TensorView& x);
int64_t CountNonFiniteReference(const TensorView& x);

namespace internal {
Status CudaSumOfSquares(const void* x, DType dtype, int64_t n, float* out, Stream* stream);
Status CudaCountNonFinite(const void* x, DType dtype, int64_t n, float* out, Stream* stream);
Status CudaSum(const void* x, DType dtype, int64_t n, float factor, float* out, Stream* stream);
Status CudaScale(void* x, DType dtype, int64_t n, float factor, Stream* stream);
Status CudaAccumulateInto(const void* src, DType dtype, float* dst, int64_t n, Stream* stream);
}  // namespace internal

}  // namespace zerort
