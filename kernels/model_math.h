// The models' element arithmetic, one definition for the CPU kernels (kernels/cpu/fast_ops.cc,
// model_ops.cc) and the CUDA kernels (kernels/cuda/model_ops.cuh, llama_ops.cuh): e^x, GELU and
// its derivative, LayerNorm's statistics, affine and backward terms, RMSNorm's, SwiGLU's and the
// rotary embeddings' (the LLaMA family's), the fused softmax cross-entropy's loss and gradient, the
// vocabulary-parallel finish, and the index maths of the embedding and of the attention's head
// layouts. Each float function is written with kernels/rounded_math.h's operations, so given the
// same inputs both devices produce the same bits, and the CPU tests execute the GPU kernels'
// arithmetic. What is not shared (the order of each row's reduction, a warp's shuffle tree on the
// GPU against a SIMD sum on the CPU; the one log per row, and the vocabulary-parallel path's exp,
// which are each device's libm) is listed in kernels/README.md.
#pragma once

#include <cstdint>

#include "zerort/kernels/rounded_math.h"

namespace zerort::math {

inline constexpr float kLog2e = 1.44269504088896340736f;  // log2(e)

// e^r for |r| <= ln 2 / 2 (Cephes' expf polynomial) times 2^n, n's bits being the low mantissa
// bits of `shifted` = n + 1.5 x 2^23 (they hold n + 2^22): unsigned arithmetic, no float-to-int
// conversion, so a NaN argument is not undefined behaviour (p is NaN anyway).
ZR_HOST_DEVICE inline float ExpOfReduced(float r, float shifted) {
  float p = 1.9875691500e-4f;
  p = Add(Mul(p, r), 1.3981999507e-3f);
  p = Add(Mul(p, r), 8.3334519073e-3f);
  p = Add(Mul(p, r), 4.1665795894e-2f);
  p = Add(Mul(p, r), 1.6666665459e-1f);
  p = Add(Mul(p, r), 5.0000001201e-1f);
  p = Add(Add(Mul(Mul(p, r), r), r), 1.0f);
  return Mul(p, BitsFloat((FloatBits(shifted) - 0x4B400000u + 127u) << 23));
}

// e^x, relative error below 3e-7 (Cephes' expf polynomial after a Cody-Waite reduction);
// arguments below -87.3 give about 1e-38 instead of smaller values or 0, above 88.37 they give
// e^88.37; NaN stays NaN. Branch-free, so CPU loops calling it vectorise.
ZR_HOST_DEVICE inline float FastExp(float x) {
  x = Min(Max(x, -87.3365447f), 88.3762626f);
  // n = round(x / ln 2), by the 1.5 x 2^23 trick (exact for |n| < 2^22; no SSE4.1 needed).
  const float shifted = Add(Mul(x, kLog2e), 12582912.0f);
  const float n = Sub(shifted, 12582912.0f);
  const float r = Add(Sub(x, Mul(n, 0.693359375f)), Mul(n, 2.12194440e-4f));  // x - n ln 2
  return ExpOfReduced(r, shifted);
}

// x in base-2 units (x log2(e)): e^(x - m) = 2^(Base2(x) - Base2(m)), the form the CUDA kernels
// that take the hardware's exp2 use (kernels/cuda/exp2.cuh).
ZR_HOST_DEVICE inline float Base2(float x) { return Mul(x, kLog2e); }

// 2^x by the same polynomial: x = n + f with n = round(x), f exact, 2^f = e^(f ln 2); relative
// error below 3e-7, arguments clamped to [-126, 127]. The CPU's twin of a GPU's exp2 (the flash
// programs' probabilities, kernels/flash_math.h).
ZR_HOST_DEVICE inline float FastExp2(float x) {
  x = Min(Max(x, -126.0f), 127.0f);
  const float shifted = Add(x, 12582912.0f);
  const float n = Sub(shifted, 12582912.0f);
  return ExpOfReduced(Mul(Sub(x, n), 0.693147181f), shifted);
}

// ---- GELU (tanh approximation) ---------------------------------------------------------------

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

// u = sqrt(2/pi) (x + 0.044715 x^3)
ZR_HOST_DEVICE inline float GeluInner(float x) {
  return Mul(kGeluScale, Add(x, Mul(Mul(Mul(kGeluCubic, x), x), x)));
}

// 0.5 x (1 + tanh u) = x sigmoid(2u) = x / (1 + e^(-2u))
ZR_HOST_DEVICE inline float Gelu(float x) {
  return Div(x, Add(1.0f, FastExp(Mul(-2.0f, GeluInner(x)))));
}

// d gelu / dx. With s = sigmoid(2u): tanh u = 2s - 1 and sech^2 u = 4 s (1 - s), so
// d/dx = 0.5 (1 + tanh u) + 0.5 x sech^2 u du/dx = s + 2 x s (1 - s) du/dx.
ZR_HOST_DEVICE inline float GeluDerivative(float x) {
  const float s = Div(1.0f, Add(1.0f, FastExp(Mul(-2.0f, GeluInner(x)))));
  const float du = Mul(kGeluScale, Add(1.0f, Mul(Mul(Mul(3.0f, kGeluCubic), x), x)));
  return Add(s, Mul(Mul(Mul(Mul(2.0f, x), s), Sub(1.0f, s)), du));
}

// The GELU backward's update of one input gradient: dinp + gelu'(x) dout.
ZR_HOST_DEVICE inline float GeluBackward(float dinp, float x, float dout) {
  return Add(dinp, Mul(GeluDerivative(x), dout));
}

// ---- LayerNorm -------------------------------------------------------------------------------

// 1 / n, the factor that turns a row's sum into its mean.
ZR_HOST_DEVICE inline float InverseCount(int n) { return Div(1.0f, static_cast<float>(n)); }

// (x - mean)^2, one term of a row's variance sum.
ZR_HOST_DEVICE inline float SquaredDeviation(float x, float mean) {
  return Mul(Sub(x, mean), Sub(x, mean));
}

// 1 / sqrt(variance + eps), from the sum of squared deviations and 1 / channels.
ZR_HOST_DEVICE inline float LayerNormRstd(float squared_sum, float inv_count, float eps) {
  return Div(1.0f, Sqrt(Add(Mul(squared_sum, inv_count), eps)));
}

// (x - mean) rstd: the normalised input.
ZR_HOST_DEVICE inline float Normalized(float x, float mean, float rstd) {
  return Mul(Sub(x, mean), rstd);
}

// (x - mean) rstd weight + bias
ZR_HOST_DEVICE inline float LayerNormOut(float x, float mean, float rstd, float weight,
                                         float bias) {
  return Add(Mul(Normalized(x, mean, rstd), weight), bias);
}

// The backward's two row sums' terms: dnorm = dy weight, and dnorm (x - mean) rstd.
ZR_HOST_DEVICE inline float LayerNormDnorm(float dy, float weight) { return Mul(dy, weight); }
ZR_HOST_DEVICE inline float LayerNormDnormNorm(float dnorm, float x, float mean, float rstd) {
  return Mul(Mul(dnorm, Sub(x, mean)), rstd);
}

// One input gradient's increment, given the row's means of dnorm and of dnorm x norm:
// (dy weight - mean(dnorm) - norm mean(dnorm norm)) rstd.
ZR_HOST_DEVICE inline float LayerNormInputGrad(float dy, float weight, float x, float mean,
                                               float rstd, float dnorm_mean,
                                               float dnorm_norm_mean) {
  return Mul(Sub(Sub(Mul(dy, weight), dnorm_mean), Mul(Normalized(x, mean, rstd), dnorm_norm_mean)),
             rstd);
}

// One row's term of the weight gradient: (x - mean) rstd dy.
ZR_HOST_DEVICE inline float LayerNormWeightGrad(float x, float mean, float rstd, float dy) {
  return Mul(Normalized(x, mean, rstd), dy);
}

// ---- RMSNorm and SwiGLU (the LLaMA family) -----------------------------------------------------

// x^2, one term of a row's sum of squares.
ZR_HOST_DEVICE inline float RmsNormSquare(float x) { return Mul(x, x); }

// 1 / sqrt(mean(x^2) + eps), from the row's sum of squares and 1 / channels: LayerNorm's rstd
// without the mean.
ZR_HOST_DEVICE inline float RmsNormRstd(float sum_squares, float inv_count, float eps) {
  return LayerNormRstd(sum_squares, inv_count, eps);
}

// x rstd weight
ZR_HOST_DEVICE inline float RmsNormOut(float x, float rstd, float weight) {
  return Mul(Mul(x, rstd), weight);
}

// The backward's row-sum term, dy weight x rstd (dn n with n = x rstd, dn = dy weight), whose
// mean over the row is `dot_mean` below.
ZR_HOST_DEVICE inline float RmsNormDot(float dy, float weight, float x, float rstd) {
  return Mul(Mul(Mul(dy, weight), x), rstd);
}

// One input gradient after the backward's add: dinp + rstd (dy weight - x rstd dot_mean).
ZR_HOST_DEVICE inline float RmsNormInputGrad(float dinp, float dy, float weight, float x,
                                             float rstd, float dot_mean) {
  return Add(dinp, Mul(rstd, Sub(Mul(dy, weight), Mul(Mul(x, rstd), dot_mean))));
}

// One row's term of the weight gradient: dy x rstd.
ZR_HOST_DEVICE inline float RmsNormWeightGrad(float dy, float x, float rstd) {
  return Mul(Mul(dy, x), rstd);
}

// sigmoid(g) = 1 / (1 + e^-g), with FastExp: the CPU's loops vectorise, and both devices agree.
ZR_HOST_DEVICE inline float Sigmoid(float g) { return Div(1.0f, Add(1.0f, FastExp(-g))); }

// silu(gate) up = gate / (1 + e^-gate) up
ZR_HOST_DEVICE inline float SwiGlu(float gate, float up) {
  return Mul(Div(gate, Add(1.0f, FastExp(-gate))), up);
}

// The backward's two gradients, with s = Sigmoid(gate): silu'(g) = s (1 + g (1 - s)), so
// d gate = dy up s (1 + g (1 - s)) and d up = dy g s.
ZR_HOST_DEVICE inline float SwiGluGateGrad(float dy, float gate, float up, float s) {
  return Mul(Mul(Mul(dy, up), s), Add(1.0f, Mul(gate, Sub(1.0f, s))));
}
ZR_HOST_DEVICE inline float SwiGluUpGrad(float dy, float gate, float s) {
  return Mul(Mul(dy, gate), s);
}

// ---- rotary embeddings (the LLaMA family) ------------------------------------------------------

// [Note: the rotary angles]
// Channel pair i of a head at position t turns by the angle t x inv_freq(i) (kernels/rope.h).
// The float kernels of both devices take inv_freq rounded once to float from rope.h's double
// (`RopeFrequency`, on the host), the angle as one float product of the position and inv_freq
// (as Hugging Face's LLaMA computes it), and its cosine and sine from `RopeCosSin`: the angle
// reduced by pi/2 in double (Cody-Waite: two parts of pi/2), the reduced angle's sine and
// cosine by fdlibm's kernel polynomials (k_sin.c, k_cos.c) in double, the quadrant's pair chosen
// and each rounded once to float. So they are within a float rounding of the float angle's true
// cosine and sine (model_math_test), and the same bits on both devices (each double operation
// rounded on its own, rounded_math.h), where sincosf and the CPU's libm each differ. The CPU's
// double reference keeps its double angles and libm.

// The angle of position t for a pair whose frequency is inv_freq.
ZR_HOST_DEVICE inline float RopeAngle(int t, float inv_freq) {
  return Mul(static_cast<float>(t), inv_freq);
}

struct CosSin {
  float cos, sin;
};

// cos and sin of `angle`, [Note: the rotary angles]. The reduction's q x kPiOver2Hi and its
// difference from the angle are exact while q < 2^20 (angles up to about 1.6e6; a position times
// an inv_freq of at most 1 at 1M positions), and no operation is fused: on a CPU without FMA a
// fused one is a library call.
ZR_HOST_DEVICE inline CosSin RopeCosSin(float angle) {
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPiOver2Hi = 1.57079632673412561417e+00;  // pi/2's first 33 bits
  constexpr double kPiOver2Lo = 6.07710050650619224932e-11;  // pi/2 - kPiOver2Hi
  const double x = angle;
  const double q = RintD(MulD(x, kTwoOverPi));
  const double r = AddD(AddD(x, -MulD(q, kPiOver2Hi)), -MulD(q, kPiOver2Lo));  // [-pi/4, pi/4]
  const double z = MulD(r, r);
  // sin r = r + r^3 (S1 + z (S2 + ... z S6)), cos r = 1 - z / 2 + z^2 (C1 + z (C2 + ... z C6)).
  double ps = 1.58969099521155010221e-10;
  ps = AddD(-2.50507602534068634195e-08, MulD(z, ps));
  ps = AddD(2.75573137070700676789e-06, MulD(z, ps));
  ps = AddD(-1.98412698298579493134e-04, MulD(z, ps));
  ps = AddD(8.33333333332248946124e-03, MulD(z, ps));
  ps = AddD(-1.66666666666666324348e-01, MulD(z, ps));
  double pc = -1.13596475577881948265e-11;
  pc = AddD(2.08757232129817482790e-09, MulD(z, pc));
  pc = AddD(-2.75573143513906633035e-07, MulD(z, pc));
  pc = AddD(2.48015872894767294178e-05, MulD(z, pc));
  pc = AddD(-1.38888888888741095749e-03, MulD(z, pc));
  pc = AddD(4.16666666666666019037e-02, MulD(z, pc));
  const double sin_r = AddD(r, MulD(MulD(r, z), ps));
  const double cos_r = AddD(AddD(1.0, MulD(-0.5, z)), MulD(MulD(z, z), pc));
  // The angle is q pi/2 + r: q mod 4 picks the pair (exact: q is an integer).
  const double quadrant = AddD(q, MulD(-4.0, FloorD(MulD(q, 0.25))));
  const double c = quadrant == 0 ? cos_r : quadrant == 1 ? -sin_r : quadrant == 2 ? -cos_r : sin_r;
  const double s = quadrant == 0 ? sin_r : quadrant == 1 ? cos_r : quadrant == 2 ? -sin_r : -cos_r;
  return {static_cast<float>(c), static_cast<float>(s)};
}

// A cosine and sine scaled by the rope's attention factor (kernels/rope.h's RopeCosSinScale: 1
// but for YaRN), each one float product, as transformers scales its cos and sin tables.
ZR_HOST_DEVICE inline CosSin RopeScaled(CosSin cs, float scale) {
  return {Mul(cs.cos, scale), Mul(cs.sin, scale)};
}

// A pair (x1, x2) turned by the angle whose cosine and sine are c and s, to
// (x1 c - x2 s, x2 c + x1 s). The transpose (the backward, the in-place turn back): by -s.
ZR_HOST_DEVICE inline float RopeTurnFirst(float x1, float x2, float c, float s) {
  return Sub(Mul(x1, c), Mul(x2, s));
}
ZR_HOST_DEVICE inline float RopeTurnSecond(float x1, float x2, float c, float s) {
  return Add(Mul(x2, c), Mul(x1, s));
}

// ---- softmax cross-entropy -------------------------------------------------------------------

// One row's loss, -(z[target] - max - log sum e^(z - max)).
ZR_HOST_DEVICE inline float CrossEntropyLoss(float z_target, float max, float log_sum) {
  return -Sub(Sub(z_target, max), log_sum);
}

// [Note: the cross-entropy's online sum]
// The CUDA cross-entropy reads a row once for both its statistics: each thread keeps a running
// maximum m of the logits it has seen and the sum s of e^(x - m) over them. A vector of logits
// whose largest exceeds m first rescales s by e^(m - new m), then adds its own terms; the block
// then takes the row's maximum M and adds the threads' s e^(m - M). m starts at kFloor, not -inf,
// so that a -inf logit's term is e^(-inf - kFloor) = 0, not e^(-inf + inf) = NaN (the two-pass
// kernel subtracted the row's finite maximum); any m at or above the logits seen gives the same
// sum, and a thread that saw no logit adds 0. NaN logits keep their NaN (a vector of them raises
// no m, and its terms make s NaN). The terms are rounded against a thread's running maximum
// instead of the row's: a difference in the last bits of the sum, whose order was the device's
// own anyway. `exp(x, m, m2)` is the caller's e^(x - m), m2 = Base2(m) (the CUDA kernels'
// ExpShifted: FastExp in fp32, the hardware's exp2 in 16 bits).
struct OnlineLogSum {
  static constexpr float kFloor = -1e30f;  // below any logit; Base2 of it is finite
  float max = kFloor;                      // m
  float max2 = Base2(kFloor);              // Base2(m)
  float sum = 0.0f;                        // s: of e^(x - m) over the logits seen

  // A vector whose largest logit is `vmax` begins (NaN raises nothing).
  template <typename Exp>
  ZR_HOST_DEVICE void Raise(float vmax, Exp exp) {
    if (!(vmax > max)) return;
    const float vmax2 = Base2(vmax);
    sum = Mul(sum, exp(max, vmax, vmax2));
    max = vmax;
    max2 = vmax2;
  }
  // One of its logits.
  template <typename Exp>
  ZR_HOST_DEVICE void Take(float x, Exp exp) {
    sum = Add(sum, exp(x, max, max2));
  }
  // s e^(m - M), the thread's part of the row's sum against the row's maximum M (the largest
  // thread's m; M2 = Base2(M)).
  template <typename Exp>
  ZR_HOST_DEVICE float SumAgainst(float row_max, float row_max2, Exp exp) const {
    return Mul(sum, exp(max, row_max, row_max2));
  }
};

// The fused kernel's logit gradient: softmax(z) scale, from shift = max + log sum; the target's
// then has `scale` subtracted (CrossEntropyTargetGrad).
ZR_HOST_DEVICE inline float CrossEntropyGrad(float z, float shift, float scale) {
  return Mul(FastExp(Sub(z, shift)), scale);
}
ZR_HOST_DEVICE inline float CrossEntropyTargetGrad(float grad, float scale) {
  return Sub(grad, scale);
}

// The vocabulary-parallel finish (each rank holds `valid` columns of the vocabulary; the row's
// max, sum of e^(z - max) and target logit are the group's): loss log(sum) + max - z[target], and
// the logit gradient (e^(z - max) / sum - [target]) scale. `exp_shifted` = e^(z - max) and
// `log_sum` are the caller's (each device's libm: this path keeps std::exp on the CPU). A
// template, so the CPU's double reference runs the same expression.
template <typename T>
ZR_HOST_DEVICE inline T VocabLoss(T log_sum, T max, T z_target) {
  return log_sum + max - z_target;
}
template <typename T>
ZR_HOST_DEVICE inline T VocabGrad(T exp_shifted, T sum, bool is_target, T scale) {
  return (exp_shifted / sum - (is_target ? T(1) : T(0))) * scale;
}

// ---- index maths -----------------------------------------------------------------------------

// The row of this rank's slice [begin, begin + count) of the token embedding that `token` reads,
// or -1 when the token is another rank's (vocabulary-parallel) or out of range.
ZR_HOST_DEVICE inline int64_t EmbeddingRow(int32_t token, int begin, int count) {
  const int64_t row = int64_t{token} - begin;
  return row >= 0 && row < count ? row : -1;
}

// [Note: the qkv layout] The attention's input holds, for each token, its `heads` query heads,
// then its `kv_heads` key heads, then its `kv_heads` value heads, `hs` values each: a row of
// (heads + 2 kv_heads) hs. Query head h attends with key/value head h / (heads / kv_heads)
// (grouped-query attention, read in place: a key/value head is stored once, not repeated per
// query head); GPT-2's kv_heads = heads gives its fused [q | k | v] rows of 3 x heads x hs. The
// backward writes the same layout, each key/value head's gradient summed over its query heads.
struct QkvLayout {
  int heads = 1, kv_heads = 1, hs = 1;
  ZR_HOST_DEVICE int group() const { return heads / kv_heads; }
  ZR_HOST_DEVICE int64_t q_cols() const { return int64_t{heads} * hs; }
  ZR_HOST_DEVICE int64_t kv_cols() const { return int64_t{kv_heads} * hs; }
  ZR_HOST_DEVICE int64_t row() const { return q_cols() + 2 * kv_cols(); }
  // Offsets within a row: query head h, and the key and value heads query head h reads.
  ZR_HOST_DEVICE int64_t q(int h) const { return int64_t{h} * hs; }
  ZR_HOST_DEVICE int64_t k(int h) const { return q_cols() + int64_t{h / group()} * hs; }
  ZR_HOST_DEVICE int64_t v(int h) const { return q_cols() + kv_cols() + int64_t{h / group()} * hs; }
};

// Element i of a head-major tensor [B, NH, T, HS]: where the same element sits in a token-major
// one with `parts` tensors side by side per token ([B, T, parts, NH, HS]).
ZR_HOST_DEVICE inline int64_t TokenMajorIndex(int64_t i, int seq, int heads, int hs, int parts) {
  const int d = static_cast<int>(i % hs);
  const int t = static_cast<int>((i / hs) % seq);
  const int h = static_cast<int>((i / (int64_t{hs} * seq)) % heads);
  const int64_t b = i / (int64_t{hs} * seq * heads);
  return ((b * seq + t) * parts * heads + h) * hs + d;
}

}  // namespace zerort::math
