// Block quantization for ZeRO++'s quantized weight gather (qwZ): CPU and CUDA twins.
//
// [Note: block quantization]
// A buffer of n elements (fp32, bf16 or fp16) is cut into QuantGroups(n) equal groups, as
// DeepSpeed's CUDAQuantizer cuts a parameter: start from ceil(n / 8000) groups, step up until n
// is a multiple of 8 x groups, then double while that still divides n and a group holds more than
// 8000 elements (so a group holds 4k-8k elements when n allows it). Each group is stored
// symmetric int8: s = max|x| / 127 (1 for a group of zeros), q = round-to-nearest-even(x / s)
// clamped to [-127, 127], and its scale s in fp32. Dequantized: x' = q x s, rounded once to the
// output dtype, so |x - x'| <= s / 2 (plus that rounding). Packed, as it goes over the wire: the
// n int8 values, then the groups' fp32 scales (n is a multiple of 8, so they are 4-byte aligned:
// callers quantize shards, multiples of 16 elements). The CPU and CUDA kernels compute the same
// values bit for bit (IEEE division and nearest-even rounding on both).
#pragma once

#include <cstdint>

#include "zerort/runtime/device.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

inline constexpr int64_t kQuantTargetGroup = 8000;  // DeepSpeed's CUDAQuantizer target

int64_t QuantGroups(int64_t n);     // n >= 8, a multiple of 8
int64_t QuantizedBytes(int64_t n);  // n + 4 x QuantGroups(n)
// x (n elements) into `packed` (QuantizedBytes(n) bytes, on x's device).
Status QuantizeInt8(const TensorView& x, void* packed, Stream* stream);
// `packed` (of out.numel() elements) into `out`.
Status DequantizeInt8(const void* packed, const TensorView& out, Stream* stream);

namespace internal {
Status CudaQuantizeInt8(const void* x, DType dtype, int64_t n, int64_t groups, void* packed,
                        Stream* stream);
Status CudaDequantizeInt8(const void* packed, int64_t n, int64_t groups, void* out, DType dtype,
                          Stream* stream);
}  // namespace internal

}  // namespace zerort
