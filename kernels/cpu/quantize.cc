// [Note: block quantization] (kernels/quantize.h), on the CPU.
#include "zerort/kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "zerort/runtime/strings.h"

namespace zerort {

int64_t QuantGroups(int64_t n) {
  ZR_CHECK(n >= 8 && n % 8 == 0) << "block quantization of " << n << " elements";
  int64_t groups = (n + kQuantTargetGroup - 1) / kQuantTargetGroup;
  while (groups < n && n % (8 * groups) != 0) ++groups;
  while (n % (8 * groups * 2) == 0 && n / groups > kQuantTargetGroup) groups *= 2;
  return groups;
}

int64_t QuantizedBytes(int64_t n) { return n + 4 * QuantGroups(n); }

namespace {

Status CheckView(const TensorView& x, const char* what) {
  if (!IsFloatingPoint(x.dtype()) || x.numel() < 8 || x.numel() % 8 != 0) {
    return absl::InvalidArgumentError(StrCat(what, ": ", x.numel(), " elements of ",
                                             DTypeName(x.dtype()),
                                             " (a floating-point multiple of 8 expected)"));
  }
  return absl::OkStatus();
}

}  // namespace

Status QuantizeInt8(const TensorView& x, void* packed, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckView(x, "QuantizeInt8"));
  const int64_t n = x.numel(), groups = QuantGroups(n), size = n / groups;
  if (x.device().is_cuda()) {
    return internal::CudaQuantizeInt8(x.data(), x.dtype(), n, groups, packed, stream);
  }
  const void* base = x.data();
  const DType dtype = x.dtype();
  return RunOnHostInOrder(stream, [=] {
    auto* q = static_cast<int8_t*>(packed);
    auto* scales = reinterpret_cast<float*>(q + n);
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t g = 0; g < groups; ++g) {
      float absmax = 0.0f;
      for (int64_t i = g * size; i < (g + 1) * size; ++i) {
        absmax = std::max(absmax, std::fabs(LoadAsFloat(base, dtype, i)));
      }
      const float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
      for (int64_t i = g * size; i < (g + 1) * size; ++i) {
        const float r = std::nearbyint(LoadAsFloat(base, dtype, i) / s);
        q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      }
      std::memcpy(&scales[g], &s, sizeof(float));
    }
    return absl::OkStatus();
  });
}

Status DequantizeInt8(const void* packed, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckView(out, "DequantizeInt8"));
  const int64_t n = out.numel(), groups = QuantGroups(n), size = n / groups;
  if (out.device().is_cuda()) {
    return internal::CudaDequantizeInt8(packed, n, groups, out.data(), out.dtype(), stream);
  }
  void* base = out.data();
  const DType dtype = out.dtype();
  return RunOnHostInOrder(stream, [=] {
    const auto* q = static_cast<const int8_t*>(packed);
    const auto* scales = reinterpret_cast<const float*>(q + n);
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      StoreFromFloat(base, dtype, i, static_cast<float>(q[i]) * scales[i / size]);
    }
    return absl::OkStatus();
  });
}

}  // namespace zerort
