#include "zerort/sharding/layer_driver.h"

#include <utility>

#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<std::unique_ptr<LayerDriver>> LayerDriver::Create(ShardManager& manager,
                                                           std::vector<Layer> layers) {
  if (layers.empty()) return absl::InvalidArgumentError("LayerDriver: no layers");
  std::unique_ptr<LayerDriver> d(new LayerDriver(&manager, nullptr, std::move(layers)));
  for (const Layer& layer : d->layers_) {
    if (!layer.forward || !layer.backward) {
      return absl::InvalidArgumentError(
          StrCat("LayerDriver: layer '", layer.name, "' needs both a forward and a backward"));
    }
    ZR_ASSIGN_OR_RETURN(int u, manager.AddUnit(layer.name, layer.params, layer.options));
    d->units_.push_back(u);
  }
  return d;
}

StatusOr<std::unique_ptr<LayerDriver>> LayerDriver::Create(Session& session,
                                                           const ShardManagerOptions& options,
                                                           std::vector<Layer> layers) {
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<ShardManager> manager,
                      ShardManager::Create(options, {.dp = &session.world(),
                                                     .device_allocator = &session.allocator(),
                                                     .tracker = &session.tracker()}));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<LayerDriver> d, Create(*manager, std::move(layers)));
  d->owned_ = std::move(manager);
  return d;
}

Status LayerDriver::Run(int layer, bool backward) {
  const Layer& l = layers_[static_cast<size_t>(layer)];
  const int unit = units_[static_cast<size_t>(layer)];
  ZR_ASSIGN_OR_RETURN(UnitScope scope,
                      backward ? manager_->BackwardScope(unit) : manager_->ForwardScope(unit));
  std::vector<TensorView> params, grads;
  for (size_t i = 0; i < l.params.size(); ++i) {
    params.push_back(scope.param(static_cast<int>(i)));
    if (backward) grads.push_back(scope.grad(static_cast<int>(i)));
  }
  const LayerTensors tensors{.params = params, .grads = grads, .loss_scale = loss_scale()};
  Status s = backward ? l.backward(tensors) : l.forward(tensors);
  if (!s.ok()) {
    // The scope still ends (released, and a backward's gradient handed on), so that this rank's
    // collectives stay in step with the others' while the error travels up.
    (void)scope.End();
    return Annotate(s, StrCat(backward ? "backward" : "forward", " of layer '", l.name, "'"));
  }
  return scope.End();
}

Status LayerDriver::Forward() {
  for (int l = 0; l < num_layers(); ++l) ZR_RETURN_IF_ERROR(Run(l, false));
  return absl::OkStatus();
}

Status LayerDriver::Backward() {
  const ShardManagerOptions& o = manager_->options();
  if (o.compute_dtype == DType::kF16 && o.loss_scale.dynamic) {
    return absl::FailedPreconditionError(StrCat(
        "LayerDriver::Backward() under fp16 dynamic loss scaling: seed the loss's gradient with "
        "loss_scale() (now ",
        loss_scale(), ") and call Backward(loss_scale) to say so"));
  }
  return Backward(loss_scale());
}

Status LayerDriver::Backward(float seeded_scale) {
  if (seeded_scale != loss_scale()) {
    return absl::InvalidArgumentError(StrCat("LayerDriver::Backward(", seeded_scale,
                                             "): the loss's gradient must be seeded with "
                                             "loss_scale() = ",
                                             loss_scale(),
                                             " (fp16 loss scaling changes it between steps)"));
  }
  for (int l = num_layers() - 1; l >= 0; --l) ZR_RETURN_IF_ERROR(Run(l, true));
  ++micro_batches_;
  return absl::OkStatus();
}

StatusOr<StepResult> LayerDriver::Step(float lr) {
  if (micro_batches_ == 0) {
    return absl::FailedPreconditionError(
        "LayerDriver::Step without a Backward since the last step");
  }
  const int k = std::exchange(micro_batches_, 0);
  return manager_->Step({.lr = lr, .micro_batches = k});
}

}  // namespace zerort
