// WeightStore: where the layers find their weights and put their gradients. Training uses the
// shard manager (a unit's weights exist in full only between Open and Close; its gradients are
// reduced when a backward Close ends); tests of the math use HostWeightStore, plain host arrays
// in float or double. The layers hold no copy of any weight: they read the views Open returns.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/span_sink.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/flat_layout.h"
#include "zerort/sharding/shard_manager.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

struct UnitTensors {
  std::vector<void*> params;  // one per ParamSpec, in the unit's order
  std::vector<void*> grads;   // backward only: add (+=) into these
};

class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // Declares the model's units in order (unit i of the model is the i-th call).
  // `options` (tied units across pipeline stages) matter to the shard manager only.
  virtual Status AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                         const UnitOptions& options = {}) = 0;
  virtual StatusOr<UnitTensors> Open(int unit, bool backward) = 0;
  virtual Status Close(int unit) = 0;
  // The element types of the weights Open returns and of the gradients it adds into; nullopt
  // where no DType names them (HostWeightStore<double>). DecoderModel::Create checks them against
  // its kernels' act_dtype and grad_dtype, so fp16 bits are never read as bf16.
  virtual std::optional<DType> param_dtype() const = 0;
  virtual std::optional<DType> grad_dtype() const = 0;
  // The stream whose work sees the weights Open returns (the shard manager's compute stream,
  // which waits for the gathers); null: they are ready on the host. DecoderModel::Create refuses
  // kernels that issue on another stream when this one is asynchronous.
  virtual Stream* stream() const { return nullptr; }
};

// The shard manager as a weight store; the manager must outlive it. Open gathers the unit (ZeRO-3)
// through a UnitScope, Close ends that scope. With `span`, each unit's forward and backward goes
// to it on the "compute" track ("forward blocks.3"), from when the compute stream starts the
// unit's work (after its gather) to when it has issued all of it: on CPU streams timed in the
// stream's own order (markers run on its thread: a queued stream's execution, an immediate
// stream's inline work), on CUDA streams the host's issue times.
std::unique_ptr<WeightStore> MakeShardManagerStore(ShardManager& manager, SpanSink span = {});

// Plain host arrays of T, every unit always present; gradients accumulate until ZeroGrads.
template <typename T>
class HostWeightStore final : public WeightStore {
 public:
  Status AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                 const UnitOptions& = {}) override {
    Unit u;
    u.specs = params;
    for (const ParamSpec& p : params) {
      u.params.emplace_back(static_cast<size_t>(p.numel()), T(0));
      u.grads.emplace_back(static_cast<size_t>(p.numel()), T(0));
    }
    units_.push_back(std::move(u));
    return absl::OkStatus();
  }
  StatusOr<UnitTensors> Open(int unit, bool backward) override {
    UnitTensors t;
    for (auto& p : units_.at(unit).params) t.params.push_back(p.data());
    if (backward) {
      for (auto& g : units_.at(unit).grads) t.grads.push_back(g.data());
    }
    return t;
  }
  Status Close(int unit) override { return absl::OkStatus(); }
  std::optional<DType> param_dtype() const override { return DTypeIfAny<T>(); }
  std::optional<DType> grad_dtype() const override { return DTypeIfAny<T>(); }

  // Fills every parameter as the shard manager would from the same initializer.
  void Initialize(const Initializer& init, uint64_t seed) {
    for (Unit& u : units_) {
      for (size_t i = 0; i < u.specs.size(); ++i) {
        std::vector<float> full(u.params[i].size());
        init(u.specs[i], seed, full);
        std::copy(full.begin(), full.end(), u.params[i].begin());
      }
    }
  }
  void ZeroGrads() {
    for (Unit& u : units_) {
      for (auto& g : u.grads) std::fill(g.begin(), g.end(), T(0));
    }
  }
  // The parameter or gradient called `name`; null when there is none.
  std::vector<T>* param(const std::string& name) { return Find(name, false); }
  std::vector<T>* grad(const std::string& name) { return Find(name, true); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Unit& u : units_) {
      for (const ParamSpec& p : u.specs) out.push_back(p.name);
    }
    return out;
  }

 private:
  struct Unit {
    std::vector<ParamSpec> specs;
    std::vector<std::vector<T>> params, grads;
  };
  std::vector<T>* Find(const std::string& name, bool grad) {
    for (Unit& u : units_) {
      for (size_t i = 0; i < u.specs.size(); ++i) {
        if (u.specs[i].name == name) return grad ? &u.grads[i] : &u.params[i];
      }
    }
    return nullptr;
  }
  std::vector<Unit> units_;
};

}  // namespace zerort
