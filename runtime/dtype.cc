// DType names, sizes and parsing.
#include "zerort/runtime/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "zerort/runtime/strings.h"

namespace zerort {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  ZR_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "invalid";
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

StatusOr<DType> ParseDType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "f32" || lower == "fp32" || lower == "float32" || lower == "float")
    return DType::kF32;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "f16" || lower == "fp16" || lower == "float16" || lower == "half")
    return DType::kF16;
  if (lower == "i32" || lower == "int32") return DType::kI32;
  if (lower == "i64" || lower == "int64") return DType::kI64;
  if (lower == "u8" || lower == "uint8") return DType::kU8;
  return absl::InvalidArgumentError(
      StrCat("unknown dtype '", name, "'; expected one of fp32, bf16, fp16, int32, int64, uint8"));
}

}  // namespace zerort
