// GptConfig: the shape of the built-in GPT-2-style model, its named presets, and the counts the
// rest of the project derives from a shape (parameters, FLOPs per token by the PaLM formula).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zerort {

struct GptConfig {
  int n_layer = 2;       // transformer blocks
  int n_head = 2;        // attention heads; must divide d_model
  int d_model = 32;      // channels (GPT-2's n_embd)
  int seq_len = 16;      // context length: rows of the position embedding
  int vocab_size = 256;  // byte-level tokens by default

  int head_size() const { return d_model / n_head; }
  // Every parameter, the tied token embedding counted once.
  int64_t NumParameters() const;
  // Parameters of one transformer block.
  int64_t BlockParameters() const;
  // FLOPs of forward + backward per token, PaLM (Chowdhery et al. 2022, appendix B):
  // 6 N + 12 L d T, with N the parameters less the position embedding (it is a lookup, while the
  // tied token embedding also serves as the output projection, a real GEMM).
  double FlopsPerToken() const;

  Status Validate() const;
  bool operator==(const GptConfig&) const = default;
};

// The rows of the token embedding with the vocabulary padded to a multiple of
// vocab_multiple x tp (Megatron's make_vocab_size_divisible_by): every tensor-parallel rank holds
// as many. The padding rows are zero, never trained, and never reach a loss, a sample, a
// checkpoint or an export. vocab_size itself at tp 1 and multiple 1.
int64_t PaddedVocab(const GptConfig& config, int tp, int vocab_multiple);

// "tiny" (a few hundred thousand parameters, for CPU tests and demos), "gpt2" (124M),
// "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1.5B); the GPT-2 shapes have vocabulary
// 50257 and context 1024.
StatusOr<GptConfig> GptPreset(std::string_view name);
std::vector<std::string> GptPresetNames();

}  // namespace zerort
