// CPU casts: the scalar reference and the OpenMP/SIMD version, plus the validating entry. On x86
// with F16C (checked at run time) fp16 <-> fp32 uses the hardware conversions, the same bits as
// runtime/dtype.h's round to nearest even (NaN kept quiet with its top payload bits).
#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define ZR_HAVE_F16C_PATH 1
#endif

#include "zerort/kernels/cast.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// One loop per (src, dst) pair so the compiler sees straight-line code it can vectorise.
template <typename Load, typename Store>
void CastLoop(int64_t n, Load load, Store store) {
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) store(i, load(i));
}

#ifdef ZR_HAVE_F16C_PATH
// F16C by CPUID (leaf 1, ECX bit 29): clang before 15 has no "f16c" for __builtin_cpu_supports.
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}

__attribute__((target("avx2,f16c"))) void F32ToF16Span(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToF16Bits(in[i]);
}

__attribute__((target("avx2,f16c"))) void F16ToF32Span(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = F16BitsToFloat(in[i]);
}

// Blocks of a span over the OpenMP threads (large casts only), each converted by `span`.
template <typename In, typename Out>
void BlockedCast(const In* in, Out* out, int64_t n, void (*span)(const In*, Out*, int64_t)) {
  constexpr int64_t kBlock = int64_t{1} << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    span(in + b * kBlock, out + b * kBlock, std::min(kBlock, n - b * kBlock));
  }
}
#endif

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
#ifdef ZR_HAVE_F16C_PATH
    if (HasF16c()) return BlockedCast(f32_in, u16_out, n, &F32ToF16Span);
#endif
    CastLoop(
        n, [&](int64_t i) { return f32_in[i]; },
        [&](int64_t i, float v) { u16_out[i] = FloatToF16Bits(v); });
  } else if (s == DType::kBF16 && d == DType::kF32) {
    CastLoop(
        n, [&](int64_t i) { return Bf16BitsToFloat(u16_in[i]); },
        [&](int64_t i, float v) { f32_out[i] = v; });
  } else if (s == DType::kF16 && d == DType::kF32) {
#ifdef ZR_HAVE_F16C_PATH
    if (HasF16c()) return BlockedCast(u16_in, f32_out, n, &F16ToF32Span);
#endif
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
  return RunOnHostInOrder(stream, [src = src.Detached(), dst = dst.Detached()] {
    internal::CpuCast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel());
    return absl::OkStatus();
  });
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
