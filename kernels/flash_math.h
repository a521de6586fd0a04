// Flash attention's tile arithmetic, one definition for the CPU kernel (kernels/cpu/fast_ops.cc)
// and the CUDA one (issue 48), written with kernels/rounded_math.h's operations as the element
// math of model_math.h is, so that the CPU tests check the arithmetic a GPU kernel built on it
// runs, without a GPU.
//
// [Note: flash attention's tiles]
// Queries are taken in tiles, keys in tiles; a query q meets the key tiles from the first up to
// the one holding q (causal: a tile wholly after q is skipped, never computed) and, in that
// diagonal tile, only keys k0 .. q (CausalKeys). With s = scale x q.k for a key it sees:
// Forward, per query: an OnlineSoftmax keeps the running maximum m of s and the sum l of
// exp(s - m) over the keys seen so far. A tile whose largest s is t moves m to max(m, t) and
// rescales l and the output accumulator by alpha = exp(m_old - m) (Rescale); each key then adds
// p = exp(s - m) to l and p x v to the accumulator. After the last tile out = accumulator / l and
// lse = m + log l, the one fp32 value per query the backward needs (Lse).
// Backward, per query and key: p = exp(s - lse) recomputed (in base 2: ProbExponent2), dP = dout.v,
// dS = p (dP - D) scale with D = dout.out for the query (ScoreGrad, FlashAttention-2's order; the
// CUDA programs' ScoreGradScaled: p (dP scale - D scale));
// then dq += dS k, dk += dS q, dv += p dout. Which sums run in which order (a tile's maximum and
// sum, the GEMMs) is each device's, as for model_math.h (kernels/README.md).
#pragma once

#include <cmath>

#include "zerort/kernels/model_math.h"

namespace zerort::math {

// Keys of the key tile [k0, k0 + kn) that query q sees: kn, or fewer in the diagonal tile; 0 or
// less for a tile after the query.
ZR_HOST_DEVICE inline int CausalKeys(int q, int k0, int kn) {
  const int seen = q - k0 + 1;
  return seen < kn ? seen : kn;
}

// Whether every query of [q0, q0 + nq) sees every key of [k0, k0 + nk) of a sequence of T (the
// first query at or after the last key, none past the end): such a block needs no mask, and only
// the blocks on the diagonal or at the tails do ([Note: the backward's whole chunks],
// kernels/flash_backward.h; the forward's tiles likewise).
ZR_HOST_DEVICE inline bool WholeBlock(int q0, int nq, int k0, int nk, int T) {
  return q0 >= k0 + nk - 1 && k0 + nk <= T && q0 + nq <= T;
}

// A score scaled as the softmax sees it: scale x (q . k), scale = 1 / sqrt(head size).
ZR_HOST_DEVICE inline float ScaledScore(float dot, float scale) { return Mul(dot, scale); }

// One query's running softmax over the key tiles seen so far.
struct OnlineSoftmax {
  float max = -INFINITY;  // the largest scaled score seen (-inf before the first tile)
  float sum = 0.0f;       // of exp(score - max) over the keys seen

  // A tile whose largest scaled score is `tile_max` begins: the new running maximum, and the
  // factor alpha = exp(old max - new max) by which the sum is (here) and the output accumulator
  // must be (by the caller) rescaled. Before the first tile the sum and accumulator are zero, so
  // alpha's value then (FastExp(-inf) is about 1e-38) does not matter.
  ZR_HOST_DEVICE float Rescale(float tile_max) {
    const float new_max = Max(max, tile_max);
    const float alpha = FastExp(Sub(max, new_max));
    sum = Mul(sum, alpha);
    max = new_max;
    return alpha;
  }
  // A key's unnormalised probability, exp(scaled score - running max).
  ZR_HOST_DEVICE float Prob(float scaled) const { return FastExp(Sub(scaled, max)); }
  // The tile's probabilities, summed (in the device's order), join the sum.
  ZR_HOST_DEVICE void Accumulate(float tile_sum) { sum = Add(sum, tile_sum); }
  // out = accumulator x Inverse(); the log-sum-exp of the query's scaled scores.
  ZR_HOST_DEVICE float Inverse() const { return Div(1.0f, sum); }
  ZR_HOST_DEVICE float Lse() const { return Add(max, ::logf(sum)); }
};

// The backward's probability of a key from the raw dot product and the forward's log-sum-exp in
// base 2 (the CUDA programs' exp2 is one instruction where a polynomial exp would be about
// twenty-six): p = 2^(dot c2 - lse2), c2 = scale log2(e) and lse2 = lse log2(e) (Base2, each once
// per call or per query). This is the exponent; the CPU takes FastExp2 of it, the CUDA programs
// the hardware's exp2 (a difference of an ulp or two, not of the argument).
ZR_HOST_DEVICE inline float ProbExponent2(float dot, float c2, float lse2) {
  return Fma(dot, c2, -lse2);
}

// dS for one (query, key): p (dP - D) scale, the gradient of the raw dot product q.k.
ZR_HOST_DEVICE inline float ScoreGrad(float p, float dp, float d, float scale) {
  return Mul(Mul(p, Sub(dp, d)), scale);
}

// ScoreGrad in two operations where the caller has D scale (`d_scaled`, a query's, computed once):
// p (dP scale - D scale), the difference in one fma. The CUDA backward's form (kernels/
// flash_backward.h: one multiply a score fewer). Bitwise ScoreGrad where scale is a power of two
// (head sizes 64 and 256: scaling by 2^k commutes with rounding, barring subnormals); otherwise
// within a rounding of it.
ZR_HOST_DEVICE inline float ScoreGradScaled(float p, float dp, float d_scaled, float scale) {
  return Mul(p, Fma(dp, scale, -d_scaled));
}

}  // namespace zerort::math
