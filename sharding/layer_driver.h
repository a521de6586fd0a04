// LayerDriver: the scopes done for a trainer whose model is a sequence of layers. Each layer is
// a unit of the shard manager with the trainer's own forward and backward functions; the driver
// runs every forward in order, each inside its unit's Forward scope (gathered before, released
// after, the next units prefetched), and every backward in reverse order inside its Backward
// scope (the gradient reduced as the scope ends), and counts the micro-batches for Step. The
// trainer keeps its activations (the functions capture them) and computes the loss between
// Forward() and Backward(), seeding the last layer's output gradient with loss x loss_scale().
//
//   std::vector<zerort::Layer> layers = {{.name = "fc0", .params = {...}, .forward = f0,
//                                         .backward = b0}, ...};
//   ZR_ASSIGN_OR_RETURN(auto model, zerort::LayerDriver::Create(*session, options, layers));
//   ZR_RETURN_IF_ERROR(model->Initialize(init));
//   each micro-batch: model->Forward(); loss and its gradient; model->Backward();
//                     (fp16: the gradient times model->loss_scale(); Backward(loss_scale))
//   each step: model->Step(lr);
//
// The gradient convention is the manager's (docs/embedding.md): a layer's backward adds (+=) the
// gradient of its micro-batch's loss times loss_scale() into `grads`, the loss being a mean over
// this rank's samples of the micro-batch; Step averages over micro-batches and ranks. The views are
// valid only during the call that receives them.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerort/runtime/session.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {

struct LayerTensors {
  std::span<const TensorView> params;  // gathered, compute dtype, read-only by convention
  std::span<const TensorView> grads;   // backward only (reduce dtype): add into them
  float loss_scale = 1.0f;             // backward: gradients are of the loss times this
};

struct Layer {
  std::string name;  // the unit's name: in errors, traces and checkpoints
  std::vector<ParamSpec> params;
  std::function<Status(const LayerTensors&)> forward;
  std::function<Status(const LayerTensors&)> backward;
  UnitOptions options;
};

class LayerDriver {
 public:
  // Registers the layers as units of `manager` (before its Initialize), in order.
  static StatusOr<std::unique_ptr<LayerDriver>> Create(ShardManager& manager,
                                                       std::vector<Layer> layers);
  // A manager of its own on the session's world, allocator and tracker.
  static StatusOr<std::unique_ptr<LayerDriver>> Create(Session& session,
                                                       const ShardManagerOptions& options,
                                                       std::vector<Layer> layers);

  // The manager's Initialize (collective): every rank the same layers and initial values.
  Status Initialize(const Initializer& init) { return manager_->Initialize(init); }
  // Every layer's forward, first to last.
  Status Forward();
  // Every layer's backward, last to first; one micro-batch more for Step. Under fp16 dynamic
  // loss scaling (compute_dtype f16, loss_scale.dynamic) the loss's gradient must be seeded with
  // loss_scale(), and forgetting it trains silently worse, so Backward() is refused there:
  // Backward(seeded_scale) says which scale the caller seeded and must equal loss_scale().
  Status Backward();
  Status Backward(float seeded_scale);
  // The optimizer step over the micro-batches since the last one (at least one).
  StatusOr<StepResult> Step(float lr);

  float loss_scale() const { return manager_->loss_scale(); }
  ShardManager& manager() { return *manager_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int unit(int layer) const { return units_.at(static_cast<size_t>(layer)); }

 private:
  LayerDriver(ShardManager* manager, std::unique_ptr<ShardManager> owned, std::vector<Layer> layers)
      : owned_(std::move(owned)), manager_(manager), layers_(std::move(layers)) {}
  Status Run(int layer, bool backward);

  std::unique_ptr<ShardManager> owned_;
  ShardManager* manager_;
  std::vector<Layer> layers_;
  std::vector<int> units_;  // per layer
  int micro_batches_ = 0;   // backward passes since the last step
};

}  // namespace zerort
