// A non-owning, contiguous (row-major) view of a typed buffer on one device. Views never own
// memory: the shard manager's buffers and the allocators' Buffers do.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[4, 768]"

// [Note: view leases]
// A view handed out for a limited time (a shard manager's scope lends its unit's weights and
// gradients until End()) carries a lease; the lender revokes it when the memory stops being the
// borrower's to use, and from then on every access to the view's data (data(), data_as(),
// span(), and the views made from it by Flat/Reshape) fails at once with a ZR_CHECK naming what
// the view was and why it ended. A view without a lease (every other view) is never checked.
// Work queued on a stream checks the lease when it is issued and runs on a Detached() copy: stream
// order, not the lease, keeps the memory valid until it runs.
// A lender opens leases often (a scope per unit per micro-batch): the description is shared, made
// once per origin, and the reason is a literal, so opening and revoking format nothing.
class ViewLease {
 public:
  // `what`: the view's origin, for the error ("unit 'fc1' (Forward scope, data-parallel rank
  // 1/2)").
  explicit ViewLease(std::shared_ptr<const std::string> what) : what_(std::move(what)) {}
  // From now on, accessing a view under this lease fails saying `why` (a literal: "its scope's
  // End()").
  void Revoke(const char* why);
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }
  const std::string& what() const { return *what_; }
  const char* why() const { return why_; }  // set before revoked() turns true

 private:
  std::shared_ptr<const std::string> what_;
  const char* why_ = "";
  std::atomic<bool> revoked_{false};
};

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::Cpu())
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {}

  void* data() const {
    CheckLease();
    return data_;
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }

  // Typed access; checks that T matches the dtype. 16-bit views hold zerort::BFloat16 or
  // zerort::Half (their .bits, ToFloat(), FromFloat()); LoadAsFloat / StoreFromFloat (dtype.h)
  // read and write any float dtype as float.
  template <typename T>
  T* data_as() const {
    static_assert(
        requires { DTypeOf<std::remove_const_t<T>>::value; },
        "TensorView::data_as<T>: T must be float, zerort::BFloat16, zerort::Half, "
        "int32_t, int64_t or uint8_t (a bf16/fp16 view is data_as<zerort::BFloat16>() "
        "or data_as<zerort::Half>(), not uint16_t; or read it with LoadAsFloat)");
    ZR_CHECK(DTypeOf<std::remove_const_t<T>>::value == dtype_)
        << "view of " << DTypeName(dtype_) << " read as "
        << DTypeName(DTypeOf<std::remove_const_t<T>>::value);
    return static_cast<T*>(data());
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

  // This view under `lease` ([Note: view leases]); the views made from it keep it.
  TensorView Leased(std::shared_ptr<const ViewLease> lease) const;
  // This view without its lease: for work queued on a stream after the lease was checked.
  TensorView Detached() const;
  bool leased() const { return lease_ != nullptr; }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_;
  std::shared_ptr<const ViewLease> lease_;

  void CheckLease() const {
    if (lease_ != nullptr && lease_->revoked()) [[unlikely]]
      FailRevoked();
  }
  [[noreturn]] void FailRevoked() const;
};

}  // namespace zerort
