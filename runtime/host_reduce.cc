// Host reductions for the loopback and MPI backends.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#include "zerort/runtime/internal/host_reduce.h"

namespace zerort::internal {
namespace {

constexpr size_t kTile = 2048;  // fp32 accumulators per tile: stays in L1

template <typename T>
float Load(const void* base, size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<const float*>(base)[i];
  } else {
    return static_cast<const T*>(base)[i].ToFloat();
  }
}

template <typename T>
void Store(void* base, size_t i, float value) {
  if constexpr (std::is_same_v<T, float>) {
    static_cast<float*>(base)[i] = value;
  } else {
    static_cast<T*>(base)[i] = T::FromFloat(value);
  }
}

template <typename T>
void ReduceFloat(std::span<const void* const> inputs, size_t offset, void* out, size_t count,
                 ReduceOp op) {
  std::array<float, kTile> acc;
  const float divisor = static_cast<float>(inputs.size());
  for (size_t begin = 0; begin < count; begin += kTile) {
    const size_t n = std::min(kTile, count - begin);
    for (size_t i = 0; i < n; ++i) acc[i] = Load<T>(inputs[0], offset + begin + i);
    for (size_t k = 1; k < inputs.size(); ++k) {
      if (op == ReduceOp::kMax) {
        for (size_t i = 0; i < n; ++i)
          acc[i] = std::max(acc[i], Load<T>(inputs[k], offset + begin + i));
      } else {
        for (size_t i = 0; i < n; ++i) acc[i] += Load<T>(inputs[k], offset + begin + i);
      }
    }
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < n; ++i) acc[i] /= divisor;
    }
    for (size_t i = 0; i < n; ++i) Store<T>(out, begin + i, acc[i]);
  }
}

template <typename T>
void ReduceInt(std::span<const void* const> inputs, size_t offset, void* out, size_t count,
               ReduceOp op) {
  auto* dst = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(inputs[0])[offset + i];
    for (size_t k = 1; k < inputs.size(); ++k) {
      const T v = static_cast<const T*>(inputs[k])[offset + i];
      // Unsigned arithmetic: integer sums wrap like NCCL's instead of being undefined.
      acc = op == ReduceOp::kMax ? std::max(acc, v)
                                 : static_cast<T>(static_cast<std::make_unsigned_t<T>>(acc) +
                                                  static_cast<std::make_unsigned_t<T>>(v));
    }
    dst[i] = acc;
  }
}

}  // namespace

void ReduceHost(std::span<const void* const> inputs, size_t offset, void* out, size_t count,
                DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32:
      return ReduceFloat<float>(inputs, offset, out, count, op);
    case DType::kBF16:
      return ReduceFloat<BFloat16>(inputs, offset, out, count, op);
    case DType::kF16:
      return ReduceFloat<Half>(inputs, offset, out, count, op);
    case DType::kI32:
      return ReduceInt<int32_t>(inputs, offset, out, count, op);
    case DType::kI64:
      return ReduceInt<int64_t>(inputs, offset, out, count, op);
    case DType::kU8:
      return ReduceInt<uint8_t>(inputs, offset, out, count, op);
  }
}

void ToFloat32(const void* src, DType dtype, float* dst, size_t count) {
  switch (dtype) {
    case DType::kF32:
      std::copy_n(static_cast<const float*>(src), count, dst);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<const BFloat16*>(src)[i].ToFloat();
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<const Half*>(src)[i].ToFloat();
      return;
    default:
      ZR_CHECK(false) << "ToFloat32 of " << DTypeName(dtype);
  }
}

void FromFloat32(const float* src, void* dst, DType dtype, size_t count) {
  switch (dtype) {
    case DType::kF32:
      std::copy_n(src, count, static_cast<float*>(dst));
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i)
        static_cast<BFloat16*>(dst)[i] = BFloat16::FromFloat(src[i]);
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) static_cast<Half*>(dst)[i] = Half::FromFloat(src[i]);
      return;
    default:
      ZR_CHECK(false) << "FromFloat32 to " << DTypeName(dtype);
  }
}

void DivideHost(void* data, size_t count, DType dtype, int divisor) {
  const float s = static_cast<float>(divisor);
  switch (dtype) {
    case DType::kF32:
      for (size_t i = 0; i < count; ++i) static_cast<float*>(data)[i] /= s;
      return;
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        auto& v = static_cast<BFloat16*>(data)[i];
        v = BFloat16::FromFloat(v.ToFloat() / s);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        auto& v = static_cast<Half*>(data)[i];
        v = Half::FromFloat(v.ToFloat() / s);
      }
      return;
    default:
      ZR_CHECK(false) << "DivideHost of " << DTypeName(dtype);
  }
}

}  // namespace zerort::internal
