// Reductions and conversions on host memory shared by the host backends (loopback, MPI).
// Floating-point inputs are reduced in fp32 and rounded once to the output dtype, so a bf16 sum
// over N ranks has one rounding, not N - 1. Integers reduce in their own type.
#pragma once

#include <cstddef>
#include <span>

#include "zerort/runtime/communicator.h"
#include "zerort/runtime/dtype.h"

namespace zerort::internal {

// out[i] = op over k of inputs[k][offset + i], for i in [0, count). `out` may alias inputs[k]
// at the same offset.
void ReduceHost(std::span<const void* const> inputs, size_t offset, void* out, size_t count,
                DType dtype, ReduceOp op);

// Element-wise conversion of floating-point data to and from fp32.
void ToFloat32(const void* src, DType dtype, float* dst, size_t count);
void FromFloat32(const float* src, void* dst, DType dtype, size_t count);

// data[i] /= divisor for floating-point data (kAvg after a sum), in fp32.
void DivideHost(void* data, size_t count, DType dtype, int divisor);

}  // namespace zerort::internal
