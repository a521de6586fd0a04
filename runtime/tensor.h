// A non-owning, contiguous (row-major) view of a typed buffer on one device. Views never own
// memory: the shard manager's buffers and the allocators' Buffers do.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zerort {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[4, 768]"

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::Cpu())
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {}

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }

  // Typed access; checks that T matches the dtype.
  template <typename T>
  T* data_as() const {
    ZR_CHECK(DTypeOf<T>::value == dtype_)
        << "view of " << DTypeName(dtype_) << " read as " << DTypeName(DTypeOf<T>::value);
    return static_cast<T*>(data_);
  }
  // Host-side span (CPU views only).
  template <typename T>
  std::span<T> span() const {
    ZR_CHECK(device_.is_cpu()) << "span() of a view on " << device_.ToString();
    return std::span<T>(data_as<T>(), static_cast<size_t>(numel()));
  }

  // Elements [begin, begin + count) of the flattened view, as a 1-D view.
  TensorView Flat(int64_t begin, int64_t count) const;
  // The same bytes with another shape of equal element count.
  TensorView Reshape(Shape shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_;
};

}  // namespace zerort
