#include "zerort/sharding/unit_gradient.h"

#include "zerort/runtime/strings.h"
#include "zerort/sharding/options.h"

namespace zerort {

UnitGradient::UnitGradient(const std::string& unit, const FlatLayout& layout, DType dtype,
                           Allocator& device, Stream& compute, bool poison_released)
    : unit_(unit),
      layout_(layout),
      dtype_(dtype),
      device_(device),
      compute_(compute),
      poison_released_(poison_released) {}

Status UnitGradient::Fail(const Status& status) const {
  return Annotate(status, StrCat("unit '", unit_, "'"));
}

Status UnitGradient::BeginBackward() {
  // Persistent (stages 0-1), or still waiting in a reduce bucket from an earlier micro-batch:
  // keep accumulating into it.
  if (buffer_) return absl::OkStatus();
  const int64_t bytes = layout_.padded_numel() * DTypeSize(dtype_);
  StatusOr<Buffer> b = device_.Allocate(bytes, MemoryCategory::kGradients, &compute_);
  if (!b.ok()) return Fail(b.status());
  buffer_ = std::move(*b);
  return FillZero(buffer_.data(), device_.device(), bytes, &compute_);
}

TensorView UnitGradient::Param(int i) {
  const Range flat = layout_.flat_range(i);
  return Full().Flat(flat.begin, flat.size()).Reshape(layout_.params()[i].shape);
}

TensorView UnitGradient::Full() {
  ZR_CHECK(buffer_) << "full gradient of unit '" << unit_ << "' outside its backward";
  return TensorView(buffer_.data(), dtype_, {layout_.padded_numel()}, device_.device());
}

Status UnitGradient::Drop(Stream& used_on) {
  ZR_CHECK(buffer_) << "the full gradient of unit '" << unit_ << "' dropped while not held";
  ZR_RETURN_IF_ERROR(device_.RecordStream(buffer_, used_on));
  if (poison_released_) {
    ZR_RETURN_IF_ERROR(
        Fail(FillBytes(buffer_.data(), device_.device(), buffer_.bytes(), kPoisonByte, &used_on)));
  }
  buffer_.Reset();
  return absl::OkStatus();
}

Status UnitGradient::Zero() {
  ZR_CHECK(buffer_) << "the full gradient of unit '" << unit_ << "' zeroed while not held";
  return FillZero(buffer_.data(), device_.device(), buffer_.bytes(), &compute_);
}

}  // namespace zerort
