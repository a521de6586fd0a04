// CPU reductions (vectorised with per-thread partial sums in a fixed order, so results do not
// depend on timing) and their scalar double-precision references, plus the validating entries.
#include <cmath>
#include <vector>

#include <omp.h>

#include "zerort/kernels/reduce.h"
#include "zerort/kernels/rounded_math.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status CheckArgs(const TensorView& x, const TensorView* out) {
  if (!IsFloatingPoint(x.dtype())) {
    return absl::InvalidArgumentError(StrCat("reduction over ", DTypeName(x.dtype()), " data"));
  }
  if (x.numel() > 0 && x.data() == nullptr) return absl::InvalidArgumentError("null input");
  if (out != nullptr) {
    if (out->dtype() != DType::kF32 || out->numel() != 1 || out->data() == nullptr) {
      return absl::InvalidArgumentError("the output must be one f32 element");
    }
    if (out->device() != x.device()) return absl::InvalidArgumentError("output on another device");
  }
  return absl::OkStatus();
}

Status CheckStream(const TensorView& x, Stream* stream) {
  if (stream == nullptr || stream->device() != x.device()) {
    return absl::InvalidArgumentError("a reduction on CUDA data needs a stream of its device");
  }
  return absl::OkStatus();
}

// Sum of f(x_i) in double, with one partial per fixed chunk combined in chunk order: accurate
// enough for a global norm over billions of elements, and deterministic.
template <typename F>
double ChunkedSum(const TensorView& x, F f, double total = 0.0) {
  const int64_t n = x.numel();
  constexpr int64_t kChunk = kReduceChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(chunks, 1)), 0.0);
  const void* base = x.data();
  const DType dtype = x.dtype();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double acc = 0.0;
    if (dtype == DType::kF32) {
      const float* p = static_cast<const float*>(base);
#pragma omp simd reduction(+ : acc)
      for (int64_t i = c * kChunk; i < end; ++i) acc += f(p[i]);
    } else {
#pragma omp simd reduction(+ : acc)
      for (int64_t i = c * kChunk; i < end; ++i) acc += f(LoadAsFloat(base, dtype, i));
    }
    partial[static_cast<size_t>(c)] = acc;
  }
  for (double p : partial) total += p;
  return total;
}

}  // namespace

Status SumOfSquares(const TensorView& x, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaSumOfSquares(x.data(), x.dtype(), x.numel(), out.data_as<float>(), stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached()] {
    *out.data_as<float>() +=
        static_cast<float>(ChunkedSum(x, [](float v) { return static_cast<double>(v) * v; }));
    return absl::OkStatus();
  });
}

Status CountNonFinite(const TensorView& x, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaCountNonFinite(x.data(), x.dtype(), x.numel(), out.data_as<float>(),
                                        stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached()] {
    *out.data_as<float>() +=
        static_cast<float>(ChunkedSum(x, [](float v) { return math::IsFinite(v) ? 0.0 : 1.0; }));
    return absl::OkStatus();
  });
}

Status Sum(const TensorView& x, double factor, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaSum(x.data(), x.dtype(), x.numel(), static_cast<float>(factor),
                             out.data_as<float>(), stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached(), factor] {
    *out.data_as<float>() +=
        static_cast<float>(factor * ChunkedSum(x, [](float v) { return static_cast<double>(v); }));
    return absl::OkStatus();
  });
}

double HostSumOfSquares(const TensorView& x, double running) {
  ZR_CHECK(x.device().is_cpu() && IsFloatingPoint(x.dtype())) << "HostSumOfSquares on device data";
  return ChunkedSum(
      x, [](float v) { return static_cast<double>(v) * v; }, running);
}

double HostCountNonFinite(const TensorView& x, double running) {
  ZR_CHECK(x.device().is_cpu() && IsFloatingPoint(x.dtype()))
      << "HostCountNonFinite on device data";
  return ChunkedSum(
      x, [](float v) { return math::IsFinite(v) ? 0.0 : 1.0; }, running);
}

Status Scale(const TensorView& x, float factor, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, nullptr));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaScale(x.data(), x.dtype(), x.numel(), factor, stream);
  }
  void* base = x.data();
  const DType dtype = x.dtype();
  const int64_t n = x.numel();
  return RunOnHostInOrder(stream, [=] {
    if (dtype == DType::kF32) {
      float* p = static_cast<float*>(base);
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) p[i] *= factor;
    } else {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i)
        StoreFromFloat(base, dtype, i, LoadAsFloat(base, dtype, i) * factor);
    }
    return absl::OkStatus();
  });
}

namespace {

Status CheckAccumulate(const char* what, const TensorView& src, const TensorView& dst) {
  ZR_RETURN_IF_ERROR(CheckArgs(src, nullptr));
  if (dst.dtype() != DType::kF32 || dst.numel() != src.numel() || dst.device() != src.device() ||
      (dst.numel() > 0 && dst.data() == nullptr)) {
    return absl::InvalidArgumentError(StrCat(what, " needs an f32 destination of ", src.numel(),
                                             " elements on ", src.device().ToString()));
  }
  return absl::OkStatus();
}

// out[i] = op(out[i], src[i] as fp32) with the source's conversion outside the loop, so that
// each loop vectorises (a dtype switch per element kept GCC from it).
template <typename Op>
void EachAsFloat(const void* in, DType dtype, float* out, int64_t n, Op op) {
  if (dtype == DType::kF32) {
    const float* f = static_cast<const float*>(in);
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) out[i] = op(out[i], f[i]);
  } else if (dtype == DType::kBF16) {
    const uint16_t* b = static_cast<const uint16_t*>(in);
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) out[i] = op(out[i], Bf16BitsToFloat(b[i]));
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(in);
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) out[i] = op(out[i], F16BitsToFloat(h[i]));
  }
}

// AccumulateInto (dst += src) and AssignInto (dst = 0 + src): the same checks and placement.
Status IntoF32(const char* what, bool assign, const TensorView& src, const TensorView& dst,
               Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckAccumulate(what, src, dst));
  if (src.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(src, stream));
    // AssignInto as the zero fill and the add: no second CUDA kernel to keep.
    if (assign) ZR_RETURN_IF_ERROR(FillZero(dst.data(), dst.device(), dst.nbytes(), stream));
    return internal::CudaAccumulateInto(src.data(), src.dtype(), dst.data_as<float>(), src.numel(),
                                        stream);
  }
  float* out = dst.data_as<float>();
  const void* in = src.data();
  const DType dtype = src.dtype();
  const int64_t n = src.numel();
  return RunOnHostInOrder(stream, [=] {
    if (assign) {  // 0 + x, not x: a -0 becomes +0 as the add into a zeroed shard makes it
      EachAsFloat(in, dtype, out, n, [](float, float x) { return 0.0f + x; });
    } else {
      EachAsFloat(in, dtype, out, n, [](float acc, float x) { return acc + x; });
    }
    return absl::OkStatus();
  });
}

}  // namespace

Status AccumulateInto(const TensorView& src, const TensorView& dst, Stream* stream) {
  return IntoF32("AccumulateInto", false, src, dst, stream);
}

Status AssignInto(const TensorView& src, const TensorView& dst, Stream* stream) {
  return IntoF32("AssignInto", true, src, dst, stream);
}

double SumOfSquaresReference(const TensorView& x) {
  double acc = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = LoadAsFloat(x.data(), x.dtype(), i);
    acc += v * v;
  }
  return acc;
}

int64_t CountNonFiniteReference(const TensorView& x) {
  int64_t count = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    count += math::IsFinite(LoadAsFloat(x.data(), x.dtype(), i)) ? 0 : 1;
  return count;
}

}  // namespace zerort
