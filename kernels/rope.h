// Rotary position embeddings' frequencies, one definition for the CPU kernels
// (kernels/cpu/llama_ops.cc) and the CUDA kernels (kernels/cuda/llama_ops.cuh): channel pair i of
// a head of hs channels turns by position x inv_freq(i), inv_freq computed on the host in double
// (the float kernels of both devices take it rounded once to float: [Note: the rotary angles],
// kernels/model_math.h).
//
// [Note: rotary scaling]
// Unscaled ("default"), inv_freq(i) = theta^(-2i / hs), Hugging Face's inv_freq. A model trained
// on a short context and extended to a longer one remaps the frequencies once, before any
// position is seen (transformers' ROPE_INIT_FUNCTIONS; the attention's scale stays 1 for both):
//   linear  inv_freq / factor (positions interpolated);
//   llama3  LLaMA 3.1's: with wavelength w = 2 pi / inv_freq and the original context L,
//           w < L / high_freq_factor (high frequencies) unchanged; w > L / low_freq_factor (low
//           frequencies) divided by factor; between the two blended, with
//           s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//           (1 - s) inv_freq / factor + s inv_freq.
// The remap is of the frequencies only: the kernels, their backward and the positions are the
// unscaled ones. Dynamic NTK, YaRN and LongRoPE change more than that and are refused where a
// config is read.
#pragma once

#include <cmath>
#include <string>

#include "zerort/runtime/status.h"

namespace zerort {

enum class RopeType : int { kDefault = 0, kLinear = 1, kLlama3 = 2 };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 0;                         // linear, llama3 (>= 1)
  double low_freq_factor = 0;                // llama3
  double high_freq_factor = 0;               // llama3 (> low_freq_factor)
  int original_max_position_embeddings = 0;  // llama3: the context L the model was trained on
  bool operator==(const RopeScaling&) const = default;
};

// What the rotary kernels take: the base and its scaling.
struct Rope {
  double theta = 10000.0;
  RopeScaling scaling = {};
};

// inv_freq of channel pair i of a head of `head_size` channels, [Note: rotary scaling].
inline double RopeInvFreq(const Rope& rope, int i, int head_size) {
  const double inv_freq = std::pow(rope.theta, -2.0 * i / head_size);
  const RopeScaling& s = rope.scaling;
  if (s.type == RopeType::kLinear) return inv_freq / s.factor;
  if (s.type != RopeType::kLlama3) return inv_freq;
  const double factor = s.factor, low = s.low_freq_factor, high = s.high_freq_factor;
  const double context = s.original_max_position_embeddings;
  const double wavelen = 2 * 3.14159265358979323846 / inv_freq;
  if (wavelen < context / high) return inv_freq;
  if (wavelen > context / low) return inv_freq / factor;
  const double smooth = (context / wavelen - low) / (high - low);
  return (1 - smooth) * inv_freq / factor + smooth * inv_freq;
}

// inv_freq rounded once to float: the float kernels' frequency on both devices.
inline float RopeFrequency(const Rope& rope, int i, int head_size) {
  return static_cast<float>(RopeInvFreq(rope, i, head_size));
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
