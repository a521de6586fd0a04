// Shape helpers and view slicing.
#include "runtime/tensor.h"

#include "absl/strings/str_join.h"

namespace zerort {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    ZR_CHECK(d >= 0) << "negative dimension in " << ShapeToString(shape);
    n *= d;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

TensorView TensorView::Flat(int64_t begin, int64_t count) const {
  ZR_CHECK(begin >= 0 && count >= 0 && begin + count <= numel())
      << "Flat(" << begin << ", " << count << ") of a view of " << numel() << " elements";
  return TensorView(static_cast<char*>(data_) + begin * static_cast<int64_t>(DTypeSize(dtype_)),
                    dtype_, Shape{count}, device_);
}

TensorView TensorView::Reshape(Shape shape) const {
  ZR_CHECK(NumElements(shape) == numel())
      << "Reshape " << ShapeToString(shape_) << " to " << ShapeToString(shape);
  return TensorView(data_, dtype_, std::move(shape), device_);
}

}  // namespace zerort
