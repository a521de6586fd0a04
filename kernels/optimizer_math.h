// The optimizers' arithmetic for one element (AdamW/Adam, SGD, LAMB), shared by the CPU loops
// (kernels/cpu/optimizer.cc, lamb.cc) and the CUDA kernels (kernels/cuda/optimizer.cu, lamb.cu):
// one definition, so the CPU tests execute the GPU's math. Every product, sum and quotient is
// rounded on its own (kernels/rounded_math.h), never fused into an FMA. Both devices therefore
// produce bitwise the same parameters and moments (tests/kernels/optimizer_cuda_test.cc checks it
// on a GPU; LAMB's trust ratio comes from sums reduced in a different order on each device, so it
// agrees to rounding). The order of operations is torch.optim's, as the golden tests expect.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/lamb.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/rounded_math.h"

namespace zerort::math {

// Adam's per-step scalars, computed on the host in double as PyTorch does for Python scalars,
// then rounded to float once.
struct AdamScalars {
  float grad_scale;
  float l2;            // wd for Adam (L2 on the gradient), 0 for AdamW
  float decay_factor;  // 1 - lr * wd for AdamW, 1 otherwise
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float step_size;  // lr / (1 - beta1^step)
};

inline AdamScalars MakeAdamScalars(const AdamHyper& h) {
  const double t = static_cast<double>(h.step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), t) : 1.0;
  return AdamScalars{
      .grad_scale = h.grad_scale,
      .l2 = h.decoupled ? 0.0f : h.weight_decay,
      .decay_factor =
          h.decoupled ? static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay) : 1.0f,
      .one_minus_beta1 = 1.0f - h.beta1,
      .beta2 = h.beta2,
      .one_minus_beta2 = 1.0f - h.beta2,
      .bias2_sqrt = static_cast<float>(std::sqrt(bc2)),
      .eps = h.eps,
      .step_size = static_cast<float>(h.lr / bc1)};
}

// One element of AdamW/Adam: updates m and v, returns the new parameter.
ZR_HOST_DEVICE inline float AdamElement(const AdamScalars& a, float p, float g, float& m,
                                        float& v) {
  g = Mul(g, a.grad_scale);
  g = Add(g, Mul(a.l2, p));
  p = Mul(p, a.decay_factor);
  m = Add(m, Mul(a.one_minus_beta1, Sub(g, m)));  // exp_avg.lerp_(grad, 1 - beta1)
  v = Add(Mul(v, a.beta2), Mul(Mul(a.one_minus_beta2, g), g));
  const float denom = Add(Div(Sqrt(v), a.bias2_sqrt), a.eps);
  return Sub(p, Mul(a.step_size, Div(m, denom)));
}

// SGD with momentum, dampening, Nesterov and L2 weight decay, as torch.optim.SGD.
struct SgdScalars {
  float lr, momentum, keep, weight_decay, grad_scale;  // keep = 1 - dampening
  bool nesterov, first_step;  // first_step: the momentum buffer starts as the gradient
};

inline SgdScalars MakeSgdScalars(const SgdHyper& h) {
  return SgdScalars{h.lr,         h.momentum, 1.0f - h.dampening, h.weight_decay,
                    h.grad_scale, h.nesterov, h.step <= 1};
}

// The decayed, scaled gradient d = g * scale + wd * p.
ZR_HOST_DEVICE inline float SgdGradient(const SgdScalars& s, float p, float g) {
  return Add(Mul(g, s.grad_scale), Mul(s.weight_decay, p));
}

// The new momentum buffer from the old one and d.
ZR_HOST_DEVICE inline float SgdMomentum(const SgdScalars& s, float buf, float d) {
  return s.first_step ? d : Add(Mul(buf, s.momentum), Mul(s.keep, d));
}

// The new parameter from d and the new buffer b (momentum != 0), or from d alone (b unused).
ZR_HOST_DEVICE inline float SgdApply(const SgdScalars& s, float p, float d, float b) {
  if (s.momentum == 0.0f) return Sub(p, Mul(s.lr, d));
  return Sub(p, Mul(s.lr, s.nesterov ? Add(d, Mul(s.momentum, b)) : b));
}

// LAMB's first pass for one element: updates m and v, returns the update direction
// m / (sqrt(v) + eps) + wd * p (no bias correction here: it is folded into the step size).
struct LambScalars {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
};

inline LambScalars MakeLambScalars(const LambHyper& h) {
  return LambScalars{h.grad_scale,   h.beta1, 1.0f - h.beta1, h.beta2,
                     1.0f - h.beta2, h.eps,   h.weight_decay};
}

ZR_HOST_DEVICE inline float LambUpdate(const LambScalars& s, float p, float g, float& m, float& v) {
  g = Mul(g, s.grad_scale);
  m = Add(Mul(s.beta1, m), Mul(s.one_minus_beta1, g));
  v = Add(Mul(s.beta2, v), Mul(Mul(s.one_minus_beta2, g), g));
  return Add(Div(m, Add(Sqrt(v), s.eps)), Mul(s.weight_decay, p));
}

// LAMB's second pass: p - step_coeff * update, step_coeff = step size x trust ratio.
ZR_HOST_DEVICE inline float LambApplyElement(float step_coeff, float p, float update) {
  return Sub(p, Mul(step_coeff, update));
}

// DeepSpeed's OnebitAdam (kernels/onebit.h), in its order: exp_avg.mul_(b1).add_(1 - b1, g),
// exp_avg_sq.mul_(b2).addcmul_(1 - b2, g, g), update = m / (sqrt(v) + eps) (+ wd p), p -= lr x
// update. No bias correction.
ZR_HOST_DEVICE inline float OneBitMomentum(float m, float g, float beta1, float one_minus_beta1) {
  return Add(Mul(m, beta1), Mul(one_minus_beta1, g));
}
ZR_HOST_DEVICE inline float OneBitVariance(float v, float g, float beta2, float one_minus_beta2) {
  return Add(Mul(v, beta2), Mul(Mul(one_minus_beta2, g), g));
}
ZR_HOST_DEVICE inline float OneBitApply(float p, float m, float v, float lr, float eps, float wd) {
  float update = Div(m, Add(Sqrt(v), eps));
  if (wd > 0.0f) update = Add(update, Mul(wd, p));
  return Sub(p, Mul(lr, update));
}

// DeepSpeed's OnebitLamb (lamb.py) after freeze_step, in its order: the fused momentum is
// (b1 m + (1-b1) g) x scaling; after its compressed mean m' = fused / scaling, the gradient
// reconstructed as (m' - b1 m) / (1-b1) updates the fresh variance, and the update is
// m' / (sqrt(v) + eps) (+ wd p) with v frozen. Returns the update; `prelim` is the update before
// the decay, `ratio` the element's (sqrt(v) + eps) / (sqrt(v_fresh) + eps).
struct OneBitLambElement {
  float update, prelim, ratio;
};
ZR_HOST_DEVICE inline float OneBitLambFused(float m, float g, float beta1, float one_minus_beta1,
                                            float scaling) {
  return Mul(OneBitMomentum(m, g, beta1, one_minus_beta1), scaling);
}
ZR_HOST_DEVICE inline OneBitLambElement OneBitLambReconstruct(float fused, float scaling, float& m,
                                                              float v, float& v_fresh, float p,
                                                              float beta1, float one_minus_beta1,
                                                              float beta2, float one_minus_beta2,
                                                              float eps, float wd) {
  const float mn = Div(fused, scaling);
  const float r = Div(Sub(mn, Mul(m, beta1)), one_minus_beta1);
  v_fresh = OneBitVariance(v_fresh, r, beta2, one_minus_beta2);
  m = mn;
  const float denom = Add(Sqrt(v), eps);
  const float prelim = Div(mn, denom);
  const float update = wd > 0.0f ? Add(prelim, Mul(wd, p)) : prelim;
  return {update, prelim, Div(denom, Add(Sqrt(v_fresh), eps))};
}

// DeepSpeed's ZeroOneAdam (zoadam.py) between and at its synchronisations, in its order: a local
// step adds t = -lr x update to the parameter and to the accumulator; a synchronisation takes
// the accumulated steps back out (p -= acc), turns them into momentum units (acc x= sqrt(v) +
// eps), and after their compressed mean sets m = -acc / lrs and p += acc / (sqrt(v) + eps).
ZR_HOST_DEVICE inline void ZeroOneLocalStep(float& p, float& acc, float m, float v, float lr,
                                            float eps, float wd) {
  float update = Div(m, Add(Sqrt(v), eps));
  if (wd > 0.0f) update = Add(update, Mul(wd, p));
  const float t = Mul(-lr, update);
  p = Add(p, t);
  acc = Add(acc, t);
}
ZR_HOST_DEVICE inline void ZeroOneSyncOut(float& p, float& acc, float v, float eps) {
  p = Sub(p, acc);
  acc = Mul(acc, Add(Sqrt(v), eps));
}
ZR_HOST_DEVICE inline void ZeroOneSyncIn(float& p, float& acc, float& m, float v, float eps,
                                         float lrs) {
  m = -Div(acc, lrs);
  p = Add(p, Div(acc, Add(Sqrt(v), eps)));
  acc = 0.0f;
}

}  // namespace zerort::math
