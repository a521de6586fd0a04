// The shard manager behind the WeightStore interface.
#include "zerort/layers/weight_store.h"

#include <map>
#include <optional>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

class ShardManagerStore final : public WeightStore {
 public:
  ShardManagerStore(ShardManager& manager, SpanSink span)
      : manager_(manager), span_(std::move(span)) {}

  Status AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                 const UnitOptions& options) override {
    ZR_ASSIGN_OR_RETURN(int index, manager_.AddUnit(name, params, options));
    units_.push_back({index, static_cast<int>(params.size())});
    return absl::OkStatus();
  }

  StatusOr<UnitTensors> Open(int unit, bool backward) override {
    const UnitInfo& info = units_.at(unit);
    if (open_.contains(unit)) {
      return absl::FailedPreconditionError(
          StrCat("unit '", manager_.unit(info.index).name(), "' is already open"));
    }
    ZR_ASSIGN_OR_RETURN(UnitScope scope, backward ? manager_.BackwardScope(info.index)
                                                  : manager_.ForwardScope(info.index));
    UnitTensors t;
    for (int i = 0; i < info.params; ++i) {
      t.params.push_back(scope.param(i).data());
      if (backward) t.grads.push_back(scope.grad(i).data());
    }
    open_.emplace(unit, std::move(scope));
    if (span_) {
      auto began = began_[unit] = std::make_shared<Clock::time_point>();
      ZR_RETURN_IF_ERROR(AtComputePoint([began] { *began = Clock::now(); }));
      what_[unit] = StrCat(backward ? "backward " : "forward ", manager_.unit(info.index).name());
    }
    return t;
  }

  Status Close(int unit) override {
    auto it = open_.find(unit);
    if (it == open_.end())
      return absl::FailedPreconditionError(StrCat("unit ", unit, " is not open"));
    if (span_) {  // before End: its release and reductions are not the unit's compute
      ZR_RETURN_IF_ERROR(
          AtComputePoint([span = span_, what = what_.at(unit), began = began_.at(unit)] {
            span(what, "compute", *began, Clock::now());
          }));
    }
    Status status = it->second.End();
    open_.erase(it);
    return status;
  }
  std::optional<DType> param_dtype() const override { return manager_.options().compute_dtype; }
  std::optional<DType> grad_dtype() const override { return manager_.options().reduce_dtype; }
  Stream* stream() const override { return &manager_.compute_stream(); }

 private:
  struct UnitInfo {
    int index;  // in the manager
    int params;
  };
  using Clock = std::chrono::system_clock;
  Status AtComputePoint(std::function<void()> f) {
    return AtStreamPoint(manager_.compute_stream(), std::move(f));
  }

  ShardManager& manager_;
  std::vector<UnitInfo> units_;
  std::map<int, UnitScope> open_;
  SpanSink span_;  // unit spans; empty: none
  std::map<int, std::shared_ptr<Clock::time_point>> began_;
  std::map<int, std::string> what_;
};

}  // namespace

std::unique_ptr<WeightStore> MakeShardManagerStore(ShardManager& manager, SpanSink span) {
  return std::make_unique<ShardManagerStore>(manager, std::move(span));
}

}  // namespace zerort
