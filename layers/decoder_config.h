// DecoderConfig: the shape of the built-in decoder (GPT-2 or the LLaMA family), its named presets,
// and the counts the rest of the project derives from a shape (parameters, FLOPs per token by the
// PaLM formula).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/kernels/rope.h"
#include "zerort/runtime/status.h"

namespace zerort {

// The decoder's architecture ([Note: the two architectures] in layers/README.md):
//   kGpt2   learned positions, LayerNorm with bias, fused QKV with bias, 4d tanh-GELU MLP, the
//           output projection tied to the token embedding;
//   kLlama  rotary positions (rope_theta, Hugging Face's rotate-half, rope_scaling's remap of
//           the frequencies: [Note: rotary scaling] in kernels/rope.h), RMSNorm (norm_eps), Q, K,
//           V projections with n_kv_head key/value heads (grouped-query attention), a SwiGLU MLP
//           of intermediate_size channels, the output projection its own weight unless
//           tie_word_embeddings. Biases by three independent flags: qkv_bias (Q, K, V: Qwen2's),
//           o_proj_bias (the attention's output) and mlp_bias (gate, up, down); LLaMA's
//           attention_bias is the first two.
//
// [Note: sliding windows]
// Mistral 7B v0.1 (and Qwen2 with use_sliding_window) lets each position attend to the last
// sliding_window positions only. For sequences no longer than the window that is every earlier
// position: full causal attention, what zerort computes. So a model with a window is built,
// imported, trained and exported (as MistralForCausalLM, its sliding_window kept) while its
// seq_len is at most the window, and refused beyond it (the windowed kernel is not written). A
// Hugging Face config's context is read as min(max_position_embeddings, sliding_window).
enum class ModelArch { kGpt2, kLlama };
std::string_view ModelArchName(ModelArch arch);

// [Note: a block's features] What a decoder block computes, one field per feature, decided once
// from the architecture and its keys (DecoderConfig::features()) and dispatched on by name
// wherever it matters (the norms, the attention's input, the MLP, the activation and scratch
// tables), so code that depends on one feature says which:
//   norm     LayerNorm (a weight, a bias, the mean and rstd saved) or RMSNorm (a weight, rstd);
//   qkv      kFused: one [3d, d] projection, learned positions (GPT-2); kRotary: Q, K and V
//            projections of their own with n_kv_head key/value heads, rotated (the LLaMA family);
//   mlp      kGelu: GELU(x W1 + b) W2 (tanh GELU, GPT-2); kSwiGlu: (SiLU(x Wg) * x Wu) Wd;
//   biases   per projection: Q/K/V, the attention's output, the MLP's (GPT-2: all);
//   qk_norm  each query and key head RMSNorm-ed over its hs channels before the rotation, one
//            [hs] gain for every query head and one for every key head (Qwen3's q_norm, k_norm).
// The two block bodies (decoder_block.cc, llama_block.cc) compute {LayerNorm, kFused, kGelu} and
// {RMSNorm, kRotary, kSwiGlu}; another combination is a field and its code, not an architecture.
enum class NormKind { kLayerNorm, kRmsNorm };
enum class QkvKind { kFused, kRotary };
enum class MlpKind { kGelu, kSwiGlu };
struct BlockFeatures {
  NormKind norm = NormKind::kLayerNorm;
  QkvKind qkv = QkvKind::kFused;
  MlpKind mlp = MlpKind::kGelu;
  bool qkv_bias = true, o_proj_bias = true, mlp_bias = true;
  bool qk_norm = false;
  bool norm_has_bias() const { return norm == NormKind::kLayerNorm; }
  bool gated_mlp() const { return mlp == MlpKind::kSwiGlu; }
  bool operator==(const BlockFeatures&) const = default;
};

struct DecoderConfig {
  int n_layer = 2;       // transformer blocks
  int n_head = 2;        // attention heads; must divide d_model (unless head_dim is set)
  int d_model = 32;      // channels (GPT-2's n_embd)
  int seq_len = 16;      // context length: rows of the position embedding (GPT-2)
  int vocab_size = 256;  // byte-level tokens by default
  ModelArch arch = ModelArch::kGpt2;
  // LLaMA only (Validate refuses them set for GPT-2):
  int n_kv_head = 0;            // key/value heads; 0: n_head (no grouping); 1: MQA
  int head_dim = 0;             // a head's channels; 0: d_model / n_head (Hugging Face's head_dim)
  int intermediate_size = 0;    // the SwiGLU MLP's channels (required)
  double rope_theta = 10000.0;  // rotary base
  RopeScaling rope_scaling =
      {};                  // the frequencies' remap ([Note: rotary scaling]); none by default
  double norm_eps = 1e-5;  // RMSNorm's epsilon
  bool tie_word_embeddings = false;
  bool qkv_bias = false;     // Q, K and V have biases (Qwen2; LLaMA's attention_bias)
  bool o_proj_bias = false;  // the attention's output projection has one (LLaMA's attention_bias)
  bool mlp_bias = false;     // gate, up and down projections have biases (LLaMA's mlp_bias)
  bool qk_norm = false;      // per-head RMSNorm of q and k before the rotation (Qwen3's)
  // Mistral's (and Qwen2's, with use_sliding_window) attention window; 0: none. [Note: sliding
  // windows]: zerort computes full causal attention, which is exactly what a window computes
  // while seq_len <= sliding_window, so a longer seq_len is refused.
  int sliding_window = 0;

  bool llama() const { return arch == ModelArch::kLlama; }
  // [Note: a block's features]: what each block computes, from arch and the bias keys.
  BlockFeatures features() const;
  int head_size() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  // The query's and the attention output's channels, n_head x head_size(): d_model unless
  // head_dim says otherwise (Mistral-Nemo: 32 heads of 128 over d 5120).
  int attention_channels() const { return n_head * head_size(); }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // The MLP's hidden channels: 4 d (GPT-2) or intermediate_size.
  int ffn_channels() const { return llama() ? intermediate_size : 4 * d_model; }
  // The output projection is the token embedding (GPT-2 always).
  bool tied() const { return !llama() || tie_word_embeddings; }
  // Learned position embeddings (wpe: GPT-2).
  bool learned_positions() const { return !llama(); }
  // Every parameter, the tied token embedding counted once.
  int64_t NumParameters() const;
  // Parameters of one transformer block.
  int64_t BlockParameters() const;
  // FLOPs of forward + backward per token, PaLM (Chowdhery et al. 2022, appendix B):
  // 6 N + 12 L d T, with N the parameters less the position embedding (it is a lookup, while the
  // tied token embedding also serves as the output projection, a real GEMM).
  double FlopsPerToken() const;

  Status Validate() const;
  // "llama, 3 layers, d 128, 4 heads (2 KV), seq 64": for logs and the estimator's title.
  std::string Describe() const;
  bool operator==(const DecoderConfig&) const = default;
};

// Rotary scaling's names (Hugging Face's rope_type: "default", "linear", "llama3", "yarn",
// "dynamic") and its checks, naming model.rope_scaling's keys: the parameters its type reads are
// in range, the others unset.
std::string_view RopeTypeName(RopeType type);
std::optional<RopeType> RopeTypeFromName(std::string_view name);
Status ValidateRopeScaling(const RopeScaling& scaling);
// "default", "linear x4", "llama3 x32 (low 1, high 4, original 8192)": for messages and logs.
std::string RopeScalingText(const RopeScaling& scaling);

// The rows of the token embedding with the vocabulary padded to a multiple of
// vocab_multiple x tp (Megatron's make_vocab_size_divisible_by): every tensor-parallel rank holds
// as many. The padding rows are zero, never trained, and never reach a loss, a sample, a
// checkpoint or an export. vocab_size itself at tp 1 and multiple 1.
int64_t PaddedVocab(const DecoderConfig& config, int tp, int vocab_multiple);

// "tiny" (a few hundred thousand parameters, for CPU tests and demos), "gpt2" (124M),
// "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1.5B); the GPT-2 shapes have vocabulary
// 50257 and context 1024. LLaMA-family: "llama-tiny" (CPU tests and demos, GQA 4:2), and the
// shapes of "llama-3-8b" (8.03B), "llama-3-70b" (70.6B) and "qwen2-72b" (72.7B) as their
// config.json files give them (for the estimator).
StatusOr<DecoderConfig> DecoderPreset(std::string_view name);
std::vector<std::string> DecoderPresetNames();

}  // namespace zerort
