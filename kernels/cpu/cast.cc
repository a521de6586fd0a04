// CPU casts: the scalar reference and the OpenMP/SIMD version, plus the validating entry.
#include <cstring>

#include "kernels/cast.h"
#include "runtime/dtype.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

// One loop per (src, dst) pair so the compiler sees straight-line code it can vectorise.
template <typename Load, typename Store>
void CastLoop(int64_t n, Load load, Store store) {
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) store(i, load(i));
}

Status Validate(const TensorView& src, const TensorView& dst) {
  if (!IsFloatingPoint(src.dtype()) || !IsFloatingPoint(dst.dtype())) {
    return absl::InvalidArgumentError(StrCat("Cast supports f32/bf16/f16, got ",
                                             DTypeName(src.dtype()), " -> ",
                                             DTypeName(dst.dtype())));
  }
  if (src.numel() != dst.numel()) {
    return absl::InvalidArgumentError(
        StrCat("Cast of ", src.numel(), " elements into ", dst.numel()));
  }
  if (src.device() != dst.device()) {
    return absl::InvalidArgumentError(
        StrCat("Cast from ", src.device().ToString(), " to ", dst.device().ToString()));
  }
  if (src.numel() > 0 && (src.data() == nullptr || dst.data() == nullptr)) {
    return absl::InvalidArgumentError("Cast of a null buffer");
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

void CpuCast(const void* src, DType s, void* dst, DType d, int64_t n) {
  if (s == d) {
    std::memmove(dst, src, static_cast<size_t>(n) * DTypeSize(s));
    return;
  }
  const auto* f32_in = static_cast<const float*>(src);
  const auto* u16_in = static_cast<const uint16_t*>(src);
  auto* f32_out = static_cast<float*>(dst);
  auto* u16_out = static_cast<uint16_t*>(dst);
  if (s == DType::kF32 && d == DType::kBF16) {
    CastLoop(
        n, [&](int64_t i) { return f32_in[i]; },
        [&](int64_t i, float v) { u16_out[i] = FloatToBf16Bits(v); });
  } else if (s == DType::kF32 && d == DType::kF16) {
    CastLoop(
        n, [&](int64_t i) { return f32_in[i]; },
        [&](int64_t i, float v) { u16_out[i] = FloatToF16Bits(v); });
  } else if (s == DType::kBF16 && d == DType::kF32) {
    CastLoop(
        n, [&](int64_t i) { return Bf16BitsToFloat(u16_in[i]); },
        [&](int64_t i, float v) { f32_out[i] = v; });
  } else if (s == DType::kF16 && d == DType::kF32) {
    CastLoop(
        n, [&](int64_t i) { return F16BitsToFloat(u16_in[i]); },
        [&](int64_t i, float v) { f32_out[i] = v; });
  } else if (s == DType::kBF16 && d == DType::kF16) {
    CastLoop(
        n, [&](int64_t i) { return Bf16BitsToFloat(u16_in[i]); },
        [&](int64_t i, float v) { u16_out[i] = FloatToF16Bits(v); });
  } else {  // f16 -> bf16
    CastLoop(
        n, [&](int64_t i) { return F16BitsToFloat(u16_in[i]); },
        [&](int64_t i, float v) { u16_out[i] = FloatToBf16Bits(v); });
  }
}

}  // namespace internal

Status Cast(const TensorView& src, const TensorView& dst, Stream* stream) {
  ZR_RETURN_IF_ERROR(Validate(src, dst));
  if (src.device().is_cuda()) {
    if (stream == nullptr || stream->device() != src.device()) {
      return absl::InvalidArgumentError("Cast of CUDA views needs a stream of their device");
    }
    return internal::CudaCast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(),
                              stream);
  }
  internal::CpuCast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel());
  return absl::OkStatus();
}

Status CastReference(const TensorView& src, const TensorView& dst) {
  ZR_RETURN_IF_ERROR(Validate(src, dst));
  if (!src.device().is_cpu()) return absl::InvalidArgumentError("CastReference runs on the CPU");
  for (int64_t i = 0; i < src.numel(); ++i) {
    StoreFromFloat(dst.data(), dst.dtype(), i, LoadAsFloat(src.data(), src.dtype(), i));
  }
  return absl::OkStatus();
}

}  // namespace zerort
