// Shape helpers and view slicing.
#include "zerort/runtime/tensor.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
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

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

TensorView TensorView::Flat(int64_t begin, int64_t count) const {
  ZR_CHECK(begin >= 0 && count >= 0 && begin + count <= numel())
      << "Flat(" << begin << ", " << count << ") of a view of " << numel() << " elements";
  CheckLease();
  TensorView v(static_cast<char*>(data_) + begin * static_cast<int64_t>(DTypeSize(dtype_)), dtype_,
               Shape{count}, device_);
  v.lease_ = lease_;
  return v;
}

TensorView TensorView::Reshape(Shape shape) const {
  ZR_CHECK(NumElements(shape) == numel())
      << "Reshape " << ShapeToString(shape_) << " to " << ShapeToString(shape);
  CheckLease();
  TensorView v(data_, dtype_, std::move(shape), device_);
  v.lease_ = lease_;
  return v;
}

TensorView TensorView::Leased(std::shared_ptr<const ViewLease> lease) const {
  TensorView v = *this;
  v.lease_ = std::move(lease);
  return v;
}

TensorView TensorView::Detached() const {
  CheckLease();
  TensorView v = *this;
  v.lease_ = nullptr;
  return v;
}

void TensorView::FailRevoked() const {
  ZR_CHECK(false) << "a view of " << lease_->what() << " (" << DTypeName(dtype_) << " "
                  << ShapeToString(shape_) << ") was used after " << lease_->why()
                  << ": views a scope hands out are valid only until its End(); open a new "
                     "scope and take the view from it";
  std::abort();
}

void ViewLease::Revoke(const char* why) {
  if (revoked()) return;
  why_ = why;
  revoked_.store(true, std::memory_order_release);
}

}  // namespace zerort
