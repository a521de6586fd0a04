// The shard manager behind the WeightStore interface.
#include "layers/weight_store.h"

#include <map>
#include <optional>

#include "runtime/strings.h"

namespace zerort {
namespace {

class ShardManagerStore final : public WeightStore {
 public:
  explicit ShardManagerStore(ShardManager& manager) : manager_(manager) {}

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
    ZR_ASSIGN_OR_RETURN(UnitScope scope,
                        backward ? manager_.Backward(info.index) : manager_.Forward(info.index));
    UnitTensors t;
    for (int i = 0; i < info.params; ++i) {
      t.params.push_back(scope.param(i).data());
      if (backward) t.grads.push_back(scope.grad(i).data());
    }
    open_.emplace(unit, std::move(scope));
    return t;
  }

  Status Close(int unit) override {
    auto it = open_.find(unit);
    if (it == open_.end())
      return absl::FailedPreconditionError(StrCat("unit ", unit, " is not open"));
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
  ShardManager& manager_;
  std::vector<UnitInfo> units_;
  std::map<int, UnitScope> open_;
};

}  // namespace

std::unique_ptr<WeightStore> MakeShardManagerStore(ShardManager& manager) {
  return std::make_unique<ShardManagerStore>(manager);
}

}  // namespace zerort
