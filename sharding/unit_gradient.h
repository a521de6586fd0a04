// UnitGradient: one unit's full gradient (the reduce dtype, the layout's padded_numel elements on
// the device) through a step: BeginBackward allocates and zeroes it at the unit's first backward
// (or keeps the one still held: stages 0-1, or a reduce bucket not yet sent), the layers add into
// Param(i), GradientReducer reads Full(), then Drop (stages 2-3, once reduced) or Zero (stages
// 0-1, once the step took this rank's slice). Part of ShardedUnit (its `grad()`), apart from the
// parameter side's state machine, which it neither reads nor changes.
#pragma once

#include <string>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/tensor.h"
#include "zerort/sharding/flat_layout.h"

namespace zerort {

class UnitGradient {
 public:
  // `unit` and `layout` are the owning unit's and must outlive this; `poison_released` as
  // ShardManagerOptions'.
  UnitGradient(const std::string& unit, const FlatLayout& layout, DType dtype, Allocator& device,
               Stream& compute, bool poison_released);

  bool held() const { return static_cast<bool>(buffer_); }
  // Allocates and zeroes the gradient on the compute stream unless one is held.
  Status BeginBackward();
  // Parameter i's gradient (held only); layers add (+=) into it.
  TensorView Param(int i);
  // The whole padded gradient (held only).
  TensorView Full();
  // Frees the gradient once `used_on` has finished with it (filled with NaN on it first under
  // poison_released).
  Status Drop(Stream& used_on);
  // Zeroes the held gradient on the compute stream.
  Status Zero();

 private:
  Status Fail(const Status& status) const;  // annotates with the unit's name

  const std::string& unit_;
  const FlatLayout& layout_;
  const DType dtype_;
  Allocator& device_;
  Stream& compute_;
  const bool poison_released_;
  Buffer buffer_;
};

}  // namespace zerort
