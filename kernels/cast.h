// Element-wise casts between f32, bf16 and f16 (round to nearest even, as runtime/dtype.h).
// Cast() validates and dispatches on the views' device: CPU (OpenMP + SIMD) or CUDA (one fused
// pass on `stream`; a CPU cast runs in `stream`'s order, RunOnHostInOrder). CastReference is the
// scalar CPU reference the twins are tested against.
#pragma once

#include "zerort/runtime/device.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

Status Cast(const TensorView& src, const TensorView& dst, Stream* stream);
Status CastReference(const TensorView& src, const TensorView& dst);

namespace internal {
// Raw entry points behind Cast(), on validated arguments.
void CpuCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);
Status CudaCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                Stream* stream);
}  // namespace internal

}  // namespace zerort
