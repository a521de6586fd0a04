// A small MLP used by the shard-manager tests: units of uneven sizes (not multiples of any world
// size), tanh between layers, mean-squared-error loss. Two implementations of the same math:
// MlpOnManager runs forward/backward through the ShardManager's scopes, as an embedding trainer
// does; MlpReference keeps plain fp32 vectors in one process (no sharding at all) and steps with
// the scalar reference optimizers. Data is deterministic per global sample index.
#pragma once

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "zerort/kernels/lamb.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/runtime/dtype.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort::testing {

// Layer widths: 7 -> 13 -> 11 -> 5 -> 3.
inline const std::vector<int>& MlpWidths() {
  static const std::vector<int> widths = {7, 13, 11, 5, 3};
  return widths;
}
inline int MlpLayers() { return static_cast<int>(MlpWidths().size()) - 1; }

inline std::vector<ParamSpec> MlpUnitParams(int layer) {
  const int in = MlpWidths()[layer];
  const int out = MlpWidths()[layer + 1];
  return {ParamSpec{"fc" + std::to_string(layer) + ".weight", {out, in}, true},
          ParamSpec{"fc" + std::to_string(layer) + ".bias", {out}, false}};
}

// Deterministic, world-size independent initial values: a function of the name and the seed.
inline void MlpInit(const ParamSpec& spec, uint64_t seed, std::span<float> full) {
  std::seed_seq seq(spec.name.begin(), spec.name.end());
  std::mt19937 rng(seq);
  rng.discard(seed % 1000);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& x : full) x = normal(rng);
}

// A view's values as host floats (device views are copied once the stream has produced them).
inline std::vector<float> HostFloats(const TensorView& v, Stream& stream) {
  std::vector<std::byte> raw(v.nbytes());
  ZR_CHECK_OK(CopyBytes(raw.data(), Device::Cpu(), v.data(), v.device(), raw.size(), &stream));
  ZR_CHECK_OK(stream.Synchronize());
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[i] = LoadAsFloat(raw.data(), v.dtype(), i);
  return out;
}

// view += add, element-wise, in the view's dtype (one rounding per element).
inline void AddInto(const TensorView& v, const std::vector<float>& add, Stream& stream) {
  std::vector<std::byte> raw(v.nbytes());
  ZR_CHECK_OK(CopyBytes(raw.data(), Device::Cpu(), v.data(), v.device(), raw.size(), &stream));
  ZR_CHECK_OK(stream.Synchronize());
  for (int64_t i = 0; i < v.numel(); ++i) {
    StoreFromFloat(raw.data(), v.dtype(), i, LoadAsFloat(raw.data(), v.dtype(), i) + add[i]);
  }
  ZR_CHECK_OK(CopyBytes(v.data(), v.device(), raw.data(), Device::Cpu(), raw.size(), &stream));
  ZR_CHECK_OK(stream.Synchronize());
}

struct Sample {
  std::vector<float> x;
  std::vector<float> target;
};

inline Sample MlpSample(int64_t index) {
  std::mt19937 rng(static_cast<uint32_t>(index * 2654435761u + 7));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Sample s{std::vector<float>(MlpWidths().front()), std::vector<float>(MlpWidths().back())};
  for (float& v : s.x) v = u(rng);
  for (float& v : s.target) v = u(rng);
  return s;
}

// Forward, loss and backward of one batch (samples [first, first + count)); the loss is the
// mean over this batch of the summed squared error. `loss_scale` multiplies the gradient.
// Returns the loss. `poison` writes an inf into the first gradient (tests of loss scaling).
inline StatusOr<double> MlpForwardBackward(ShardManager& m, const std::vector<int>& units,
                                           int64_t first, int count, float loss_scale,
                                           bool poison = false) {
  const int layers = MlpLayers();
  std::vector<Sample> batch;
  for (int b = 0; b < count; ++b) batch.push_back(MlpSample(first + b));
  // acts[l][b]: input of layer l for sample b (after tanh for l > 0).
  std::vector<std::vector<std::vector<float>>> acts(layers + 1);
  for (const Sample& s : batch) acts[0].push_back(s.x);
  Stream& stream = m.compute_stream();
  for (int l = 0; l < layers; ++l) {
    ZR_ASSIGN_OR_RETURN(UnitScope scope, m.ForwardScope(units[l]));
    const std::vector<float> w = HostFloats(scope.param(0), stream);
    const std::vector<float> bias = HostFloats(scope.param(1), stream);
    const int in = MlpWidths()[l], out = MlpWidths()[l + 1];
    for (int b = 0; b < count; ++b) {
      std::vector<float> y(out);
      for (int o = 0; o < out; ++o) {
        float acc = bias[o];
        for (int i = 0; i < in; ++i) acc += w[o * in + i] * acts[l][b][i];
        y[o] = l + 1 < layers ? std::tanh(acc) : acc;
      }
      acts[l + 1].push_back(std::move(y));
    }
    ZR_RETURN_IF_ERROR(scope.End());
  }
  double loss = 0;
  const int out_width = MlpWidths().back();
  std::vector<std::vector<float>> delta(count, std::vector<float>(out_width));
  for (int b = 0; b < count; ++b) {
    for (int o = 0; o < out_width; ++o) {
      const float diff = acts[layers][b][o] - batch[b].target[o];
      loss += static_cast<double>(diff) * diff / count;
      delta[b][o] = 2.0f * diff / static_cast<float>(count) * loss_scale;
    }
  }
  for (int l = layers - 1; l >= 0; --l) {
    ZR_ASSIGN_OR_RETURN(UnitScope scope, m.BackwardScope(units[l]));
    const std::vector<float> w = HostFloats(scope.param(0), stream);
    const int in = MlpWidths()[l], out = MlpWidths()[l + 1];
    std::vector<float> dw(static_cast<size_t>(out) * in, 0.0f), db(out, 0.0f);
    std::vector<std::vector<float>> prev(count, std::vector<float>(in, 0.0f));
    for (int o = 0; o < out; ++o) {
      for (int b = 0; b < count; ++b) db[o] += delta[b][o];
      for (int i = 0; i < in; ++i) {
        for (int b = 0; b < count; ++b) dw[o * in + i] += delta[b][o] * acts[l][b][i];
        for (int b = 0; b < count; ++b) prev[b][i] += delta[b][o] * w[o * in + i];
      }
    }
    if (poison && l == 0) dw[0] = INFINITY;
    AddInto(scope.grad(0), dw, stream);
    AddInto(scope.grad(1), db, stream);
    if (l > 0) {  // through tanh: d/dz tanh(z) = 1 - tanh(z)^2
      for (int b = 0; b < count; ++b) {
        for (int i = 0; i < in; ++i) prev[b][i] *= 1.0f - acts[l][b][i] * acts[l][b][i];
      }
    }
    delta = std::move(prev);
    ZR_RETURN_IF_ERROR(scope.End());
  }
  return loss;
}

// The same model in plain vectors, one process, no sharding.
struct MlpReference {
  std::vector<std::vector<float>> params;  // fc0.weight, fc0.bias, fc1.weight, ...
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> m, v;
  std::vector<bool> decay;
  int64_t steps = 0;

  explicit MlpReference(uint64_t seed) {
    for (int l = 0; l < MlpLayers(); ++l) {
      for (const ParamSpec& spec : MlpUnitParams(l)) {
        params.emplace_back(spec.numel());
        MlpInit(spec, seed, params.back());
        grads.emplace_back(spec.numel(), 0.0f);
        m.emplace_back(spec.numel(), 0.0f);
        v.emplace_back(spec.numel(), 0.0f);
        decay.push_back(spec.weight_decay);
      }
    }
  }

  // Gradients of the mean loss over samples [first, first + count), accumulated into grads.
  void Backward(int64_t first, int count) {
    const int layers = MlpLayers();
    std::vector<std::vector<std::vector<float>>> acts(layers + 1);
    std::vector<Sample> batch;
    for (int b = 0; b < count; ++b) batch.push_back(MlpSample(first + b));
    for (const Sample& s : batch) acts[0].push_back(s.x);
    for (int l = 0; l < layers; ++l) {
      const int in = MlpWidths()[l], out = MlpWidths()[l + 1];
      for (int b = 0; b < count; ++b) {
        std::vector<float> y(out);
        for (int o = 0; o < out; ++o) {
          float acc = params[2 * l + 1][o];
          for (int i = 0; i < in; ++i) acc += params[2 * l][o * in + i] * acts[l][b][i];
          y[o] = l + 1 < layers ? std::tanh(acc) : acc;
        }
        acts[l + 1].push_back(std::move(y));
      }
    }
    const int out_width = MlpWidths().back();
    std::vector<std::vector<float>> delta(count, std::vector<float>(out_width));
    for (int b = 0; b < count; ++b) {
      for (int o = 0; o < out_width; ++o) {
        delta[b][o] = 2.0f * (acts[layers][b][o] - batch[b].target[o]) / static_cast<float>(count);
      }
    }
    for (int l = layers - 1; l >= 0; --l) {
      const int in = MlpWidths()[l], out = MlpWidths()[l + 1];
      std::vector<std::vector<float>> prev(count, std::vector<float>(in, 0.0f));
      for (int o = 0; o < out; ++o) {
        for (int b = 0; b < count; ++b) grads[2 * l + 1][o] += delta[b][o];
        for (int i = 0; i < in; ++i) {
          for (int b = 0; b < count; ++b) grads[2 * l][o * in + i] += delta[b][o] * acts[l][b][i];
          for (int b = 0; b < count; ++b) prev[b][i] += delta[b][o] * params[2 * l][o * in + i];
        }
      }
      if (l > 0) {
        for (int b = 0; b < count; ++b) {
          for (int i = 0; i < in; ++i) prev[b][i] *= 1.0f - acts[l][b][i] * acts[l][b][i];
        }
      }
      delta = std::move(prev);
    }
  }

  double GradNorm(float scale) const {
    double s = 0;
    for (const auto& g : grads) {
      for (float x : g) s += static_cast<double>(x) * scale * x * scale;
    }
    return std::sqrt(s);
  }

  // One optimizer step on the accumulated gradients (scaled by `grad_scale`), then zero them.
  void Step(const ShardManagerOptions& o, float lr, float grad_scale) {
    ++steps;
    for (size_t k = 0; k < params.size(); ++k) {
      const int64_t n = static_cast<int64_t>(params[k].size());
      const float wd = decay[k] ? o.optimizer.weight_decay : 0.0f;
      TensorView p(params[k].data(), DType::kF32, {n}), g(grads[k].data(), DType::kF32, {n});
      TensorView mv(m[k].data(), DType::kF32, {n}), vv(v[k].data(), DType::kF32, {n});
      if (o.optimizer.kind == OptimizerKind::kLamb) {
        // The whole parameter at once: its norms need no sum over shards.
        const LambHyper h{.lr = lr,
                          .beta1 = o.optimizer.beta1,
                          .beta2 = o.optimizer.beta2,
                          .eps = o.optimizer.eps,
                          .weight_decay = wd,
                          .step = steps,
                          .grad_scale = grad_scale};
        float sums[2] = {0.0f, 0.0f};
        const TensorView s(sums, DType::kF32, {2});
        ZR_CHECK_OK(LambMoments(h, p, g, mv, vv, s, nullptr));
        ZR_CHECK_OK(
            LambApply(h, LambCoefficient(h, sums[0], sums[1]), p, g, TensorView(), nullptr));
      } else if (o.optimizer.kind == OptimizerKind::kSgd) {
        const SgdHyper h{.lr = lr,
                         .momentum = o.optimizer.momentum,
                         .dampening = o.optimizer.dampening,
                         .weight_decay = wd,
                         .nesterov = o.optimizer.nesterov,
                         .step = steps,
                         .grad_scale = grad_scale};
        ZR_CHECK_OK(SgdStepReference(h, p, g, mv, TensorView()));
      } else {
        const AdamHyper h{.lr = lr,
                          .beta1 = o.optimizer.beta1,
                          .beta2 = o.optimizer.beta2,
                          .eps = o.optimizer.eps,
                          .weight_decay = wd,
                          .decoupled = o.optimizer.kind == OptimizerKind::kAdamW,
                          .step = steps,
                          .grad_scale = grad_scale};
        ZR_CHECK_OK(AdamStepReference(h, p, g, mv, vv, TensorView()));
      }
      std::fill(grads[k].begin(), grads[k].end(), 0.0f);
    }
  }
};

}  // namespace zerort::testing
