// Rotary position embeddings' frequencies, one definition for the CPU kernels
// (kernels/cpu/llama_ops.cc) and the CUDA kernels (kernels/cuda/llama_ops.cuh): channel pair i of
// a head of hs channels turns by position x inv_freq(i), inv_freq computed on the host in double
// (the float kernels of both devices take it rounded once to float: [Note: the rotary angles],
// kernels/model_math.h).
//
// [Note: rotary scaling]
// Unscaled ("default"), inv_freq(i) = theta^(-2i / hs), Hugging Face's inv_freq. A model trained
// on a short context and extended to a longer one remaps the frequencies once, before any
// position is seen (transformers' ROPE_INIT_FUNCTIONS):
//   linear  inv_freq / factor (positions interpolated);
//   llama3  LLaMA 3.1's: with wavelength w = 2 pi / inv_freq and the original context L,
//           w < L / high_freq_factor (high frequencies) unchanged; w > L / low_freq_factor (low
//           frequencies) divided by factor; between the two blended, with
//           s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//           (1 - s) inv_freq / factor + s inv_freq;
//   yarn    YaRN (Peng et al. 2023), as transformers 5 and vLLM compute it: the pairs that turn
//           more than beta_fast (32) times over the original context L are kept, those that turn
//           less than beta_slow (1) times divided by factor, and a linear ramp between, over pair
//           indices: with d(b) = hs ln(L / (2 pi b)) / (2 ln theta), low = max(floor(d(beta_fast)),
//           0), high = min(ceil(d(beta_slow)), hs - 1) (high + 0.001 where they meet) and
//           r = clamp((i - low) / (high - low), 0, 1), r inv_freq / factor + (1 - r) inv_freq.
//           It also scales every cosine and sine by the attention factor m (so each q.k score
//           by m^2): attention_factor where given, else 0.1 ln(factor) + 1 (1 for factor <= 1),
//           or DeepSeek's ratio mscale(factor, mscale) / mscale(factor, mscale_all_dim) where
//           both are set. L is rope_scaling's original_max_position_embeddings, the model's
//           max_position_embeddings where the Hugging Face config has none; factor is always
//           rope_scaling's own (some transformers 4 releases replaced it by max_position_embeddings
//           / original_max_position_embeddings where the latter is given: a different model
//           wherever the two disagree).
//   dynamic transformers' dynamic NTK: for a sequence of T positions longer than the context L
//           (the model's max_position_embeddings, which transformers reads here, not
//           rope_scaling's own original_max_position_embeddings), the base theta becomes
//           theta ((factor T / L) - (factor - 1))^(hs / (hs - 2)); up to L it is unscaled. T is
//           the run's seq_len (Rope::seq_len): every sequence zerort rotates has that many
//           positions. transformers recomputes at each forward from the longest position it has
//           seen (growing, and unscaled again below L); for a sequence of T positions its
//           frequencies are these. So a run at seq_len <= L is the unscaled model (as training
//           from a Hugging Face model always is: model.init_from refuses a longer seq_len), and
//           `zerort eval` at a longer seq_len rotates as transformers does at that length.
// The remap is of the frequencies and, for YaRN, their cosines' and sines' scale only: the
// kernels, their backward (the transpose, scaled the same) and the positions are the unscaled
// ones. LongRoPE (Phi-3's per-pair factors) is refused where a config is read.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "zerort/runtime/status.h"

namespace zerort {

enum class RopeType : int { kDefault = 0, kLinear = 1, kLlama3 = 2, kYarn = 3, kDynamic = 4 };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 0;                         // linear, llama3, yarn, dynamic (>= 1)
  double low_freq_factor = 0;                // llama3
  double high_freq_factor = 0;               // llama3 (> low_freq_factor)
  int original_max_position_embeddings = 0;  // llama3, yarn, dynamic: the context L trained on
  double attention_factor = 0;               // yarn: the cosines' scale; 0: from factor
  double beta_fast = 0;                      // yarn: 0 is 32
  double beta_slow = 0;                      // yarn: 0 is 1
  double mscale = 0;                         // yarn (DeepSeek's): with mscale_all_dim, or 0
  double mscale_all_dim = 0;                 // yarn
  bool operator==(const RopeScaling&) const = default;
};

// YaRN's ramp ends, transformers' defaults where the config leaves them unset (0).
inline constexpr double kYarnBetaFast = 32, kYarnBetaSlow = 1;
inline double YarnBetaFast(const RopeScaling& s) {
  return s.beta_fast > 0 ? s.beta_fast : kYarnBetaFast;
}
inline double YarnBetaSlow(const RopeScaling& s) {
  return s.beta_slow > 0 ? s.beta_slow : kYarnBetaSlow;
}

// What the rotary kernels take: the base, its scaling and the run's sequence length.
struct Rope {
  double theta = 10000.0;
  RopeScaling scaling = {};
  // The positions every sequence rotates (DecoderConfig::seq_len): dynamic NTK's T; 0 (unknown)
  // reads as the original context. The other scalings do not read it.
  int seq_len = 0;
  bool operator==(const Rope&) const = default;
};

// inv_freq of channel pair i of a head of `head_size` channels, [Note: rotary scaling].
inline double RopeInvFreq(const Rope& rope, int i, int head_size) {
  const RopeScaling& s = rope.scaling;
  if (s.type == RopeType::kDynamic) {
    const double context = s.original_max_position_embeddings;
    const double length = std::max(static_cast<double>(rope.seq_len), context);
    const double base = rope.theta * std::pow(s.factor * length / context - (s.factor - 1),
                                              head_size / (head_size - 2.0));
    return std::pow(base, -2.0 * i / head_size);
  }
  const double inv_freq = std::pow(rope.theta, -2.0 * i / head_size);
  if (s.type == RopeType::kLinear) return inv_freq / s.factor;
  if (s.type == RopeType::kYarn) {
    const double context = s.original_max_position_embeddings;
    const double beta_fast = YarnBetaFast(s), beta_slow = YarnBetaSlow(s);
    auto pair_of = [&](double turns) {  // the pair index that turns `turns` times over L
      return head_size * std::log(context / (turns * 2 * 3.14159265358979323846)) /
             (2 * std::log(rope.theta));
    };
    const double low = std::max(std::floor(pair_of(beta_fast)), 0.0);
    double high = std::min(std::ceil(pair_of(beta_slow)), head_size - 1.0);
    if (low == high) high += 0.001;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    return ramp * (inv_freq / s.factor) + (1 - ramp) * inv_freq;
  }
  if (s.type != RopeType::kLlama3) return inv_freq;
  const double factor = s.factor, low = s.low_freq_factor, high = s.high_freq_factor;
  const double context = s.original_max_position_embeddings;
  const double wavelen = 2 * 3.14159265358979323846 / inv_freq;
  if (wavelen < context / high) return inv_freq;
  if (wavelen > context / low) return inv_freq / factor;
  const double smooth = (context / wavelen - low) / (high - low);
  return (1 - smooth) * inv_freq / factor + smooth * inv_freq;
}

// The scale of every cosine and sine ([Note: rotary scaling]): YaRN's attention factor, else 1.
inline double RopeAttentionFactor(const Rope& rope) {
  const RopeScaling& s = rope.scaling;
  if (s.type != RopeType::kYarn) return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  auto mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
  if (s.mscale != 0 && s.mscale_all_dim != 0) return mscale(s.mscale) / mscale(s.mscale_all_dim);
  return mscale(1.0);
}

// inv_freq rounded once to float: the float kernels' frequency on both devices.
inline float RopeFrequency(const Rope& rope, int i, int head_size) {
  return static_cast<float>(RopeInvFreq(rope, i, head_size));
}

// The attention factor rounded once to float: the float kernels' scale of each cosine and sine.
inline float RopeCosSinScale(const Rope& rope) {
  return static_cast<float>(RopeAttentionFactor(rope));
}

// The largest head size the CUDA rotary kernels take (their frequencies travel as a kernel
// argument: [Note: the rotary frequencies' argument], kernels/cuda/llama_ops.cuh), and the check a
// CUDA run makes before it starts (the error names the head size and the limit).
inline constexpr int kMaxCudaRopeHeadSize = 512;
inline Status CheckCudaRope(int head_size) {
  if (head_size <= kMaxCudaRopeHeadSize) return absl::OkStatus();
  return absl::InvalidArgumentError("head size " + std::to_string(head_size) +
                                    ": the CUDA rotary embeddings take head sizes up to " +
                                    std::to_string(kMaxCudaRopeHeadSize));
}

}  // namespace zerort
