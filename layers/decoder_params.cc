// The decoder's parameters (units, tensor-parallel specs), their initialisation, and token
// sampling: pure functions of the config and seeds, shared by the model, the estimator and tests.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <unordered_map>

#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NameHash(std::string_view name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1] from 53 random bits.
double Unit53(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

bool Decayed(ParamRole role) {
  return role == ParamRole::kWeight || role == ParamRole::kResidualWeight;
}

StatusOr<ParamSpec> TensorParallelSpec(std::string name, Shape global_shape, bool weight_decay,
                                       TensorSplit split, int tp_size, int tp_rank, int groups) {
  GlobalFrame frame{.split_dim = -1, .parts = tp_size, .part = tp_rank, .groups = groups};
  if (split == TensorSplit::kColumn || split == TensorSplit::kVocab) frame.split_dim = 0;
  if (split == TensorSplit::kRow && global_shape.size() > 1) frame.split_dim = 1;
  return SplitParam(std::move(name), std::move(global_shape), weight_decay, frame);
}

namespace {

// The LLaMA family's units ([Note: the two architectures], layers/README.md): "embeddings" (wte),
// "blocks.i", "final_norm" (norm.weight) and, untied, "head" (lm_head.weight). `param` appends
// one parameter with its role ([Note: parameter roles]) and its tensor-parallel split.
template <typename Param>
StatusOr<std::vector<DecoderUnit>> LlamaUnits(const DecoderConfig& c, Param& param) {
  using enum TensorSplit;
  using enum ParamRole;
  const int64_t d = c.d_model, kv = int64_t{c.kv_heads()} * c.head_size(), f = c.intermediate_size;
  const int64_t a = c.attention_channels();  // d unless head_dim says otherwise
  std::vector<DecoderUnit> units;
  auto vocab = [&](DecoderUnit& u, const char* name) -> Status {
    ZR_RETURN_IF_ERROR(param(u, name, {c.vocab_size, d}, kWeight, kVocab));
    return absl::OkStatus();
  };
  DecoderUnit emb{"embeddings", {}};
  ZR_RETURN_IF_ERROR(vocab(emb, "wte"));
  units.push_back(std::move(emb));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = StrCat("blocks.", l, ".");
    DecoderUnit b{StrCat("blocks.", l), {}};
    // The order of decoder::LlamaParam (decoder_block.h); the optional biases last.
    ZR_RETURN_IF_ERROR(param(b, p + "attn_norm.weight", {d}, kNormGain, kReplicated));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.q.weight", {a, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.k.weight", {kv, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.v.weight", {kv, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.o.weight", {d, a}, kWeight, kRow));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp_norm.weight", {d}, kNormGain, kReplicated));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.gate.weight", {f, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.up.weight", {f, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.down.weight", {d, f}, kWeight, kRow));
    if (c.qkv_bias) {
      ZR_RETURN_IF_ERROR(param(b, p + "attn.q.bias", {a}, kBias, kColumn));
      ZR_RETURN_IF_ERROR(param(b, p + "attn.k.bias", {kv}, kBias, kColumn));
      ZR_RETURN_IF_ERROR(param(b, p + "attn.v.bias", {kv}, kBias, kColumn));
    }
    // Row-parallel layers' biases are whole on every rank, added once after the reduction.
    if (c.o_proj_bias) {
      ZR_RETURN_IF_ERROR(param(b, p + "attn.o.bias", {d}, kBias, kRow));
    }
    if (c.mlp_bias) {
      ZR_RETURN_IF_ERROR(param(b, p + "mlp.gate.bias", {f}, kBias, kColumn));
      ZR_RETURN_IF_ERROR(param(b, p + "mlp.up.bias", {f}, kBias, kColumn));
      ZR_RETURN_IF_ERROR(param(b, p + "mlp.down.bias", {d}, kBias, kRow));
    }
    // Qwen3's per-head norms: one gain over a head's channels, shared by every head here and on
    // every tensor-parallel rank (each rank's heads add their part: decoder_block.h).
    if (c.qk_norm) {
      ZR_RETURN_IF_ERROR(
          param(b, p + "attn.q_norm.weight", {c.head_size()}, kNormGain, kReplicated));
      ZR_RETURN_IF_ERROR(
          param(b, p + "attn.k_norm.weight", {c.head_size()}, kNormGain, kReplicated));
    }
    units.push_back(std::move(b));
  }
  DecoderUnit norm{"final_norm", {}};
  ZR_RETURN_IF_ERROR(param(norm, "norm.weight", {d}, kNormGain, kReplicated));
  units.push_back(std::move(norm));
  if (!c.tied()) {
    DecoderUnit head{"head", {}};
    ZR_RETURN_IF_ERROR(vocab(head, "lm_head.weight"));
    units.push_back(std::move(head));
  }
  return units;
}

}  // namespace

StatusOr<std::vector<DecoderUnit>> DecoderUnits(const DecoderConfig& c, int tp_size, int tp_rank,
                                                int vocab_multiple) {
  ZR_RETURN_IF_ERROR(c.Validate());
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size || c.n_head % tp_size != 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor-parallel rank ", tp_rank, " of ", tp_size, " for ", c.n_head, " heads"));
  }
  if (c.llama() && c.kv_heads() % tp_size != 0) {
    // Megatron replicates key/value heads when tp exceeds them; zerort does not (yet): each rank
    // holds whole key/value heads and the query heads that read them.
    return absl::InvalidArgumentError(
        StrCat("tensor parallelism ", tp_size, " must divide model.n_kv_head = ", c.kv_heads(),
               " (key/value heads are split over the tensor-parallel ranks, not replicated)"));
  }
  if (c.llama() && c.intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor parallelism ", tp_size,
               " must divide model.intermediate_size = ", c.intermediate_size,
               " (the MLP's channels are split over the tensor-parallel "
               "ranks)"));
  }
  if (vocab_multiple < 1) {
    return absl::InvalidArgumentError(
        StrCat("make_vocab_size_divisible_by = ", vocab_multiple, ": must be >= 1"));
  }
  const int64_t d = c.d_model;
  std::vector<DecoderUnit> units;
  // A vocabulary-split weight is padded (Megatron's make_vocab_size_divisible_by) so that every
  // rank holds as many rows; the rows past vocab_size are padding.
  auto param = [&](DecoderUnit& u, std::string name, Shape shape, ParamRole role, TensorSplit split,
                   int groups = 1) -> Status {
    if (split == TensorSplit::kVocab) shape[0] = PaddedVocab(c, tp_size, vocab_multiple);
    ZR_ASSIGN_OR_RETURN(ParamSpec p,
                        TensorParallelSpec(std::move(name), std::move(shape), Decayed(role), split,
                                           tp_size, tp_rank, groups));
    if (split == TensorSplit::kVocab && p.global_shape()[0] != c.vocab_size) {
      p.frame.valid_rows = c.vocab_size;
    }
    u.params.push_back(std::move(p));
    u.roles.push_back(role);
    return absl::OkStatus();
  };
  if (c.llama()) return LlamaUnits(c, param);
  using enum ParamRole;
  DecoderUnit emb{"embeddings", {}};
  ZR_RETURN_IF_ERROR(param(emb, "wte", {c.vocab_size, d}, kWeight, TensorSplit::kVocab));
  ZR_RETURN_IF_ERROR(param(emb, "wpe", {c.seq_len, d}, kWeight, TensorSplit::kReplicated));
  units.push_back(std::move(emb));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = StrCat("blocks.", l, ".");
    DecoderUnit b{StrCat("blocks.", l), {}};
    using enum TensorSplit;
    ZR_RETURN_IF_ERROR(param(b, p + "ln1.weight", {d}, kNormGain, kReplicated));
    ZR_RETURN_IF_ERROR(param(b, p + "ln1.bias", {d}, kBias, kReplicated));
    // Fused Q, K, V: split per head (3 stacked blocks), not contiguously.
    ZR_RETURN_IF_ERROR(param(b, p + "attn.qkv.weight", {3 * d, d}, kWeight, kColumn, 3));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.qkv.bias", {3 * d}, kBias, kColumn, 3));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.proj.weight", {d, d}, kResidualWeight, kRow));
    ZR_RETURN_IF_ERROR(param(b, p + "attn.proj.bias", {d}, kBias, kRow));
    ZR_RETURN_IF_ERROR(param(b, p + "ln2.weight", {d}, kNormGain, kReplicated));
    ZR_RETURN_IF_ERROR(param(b, p + "ln2.bias", {d}, kBias, kReplicated));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.fc.weight", {4 * d, d}, kWeight, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.fc.bias", {4 * d}, kBias, kColumn));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.proj.weight", {d, 4 * d}, kResidualWeight, kRow));
    ZR_RETURN_IF_ERROR(param(b, p + "mlp.proj.bias", {d}, kBias, kRow));
    units.push_back(std::move(b));
  }
  DecoderUnit norm{"final_norm", {}};
  ZR_RETURN_IF_ERROR(param(norm, "ln_f.weight", {d}, kNormGain, TensorSplit::kReplicated));
  ZR_RETURN_IF_ERROR(param(norm, "ln_f.bias", {d}, kBias, TensorSplit::kReplicated));
  units.push_back(std::move(norm));
  return units;
}

Initializer DecoderInitializer(const DecoderConfig& config) {
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  // Each parameter's role, as DecoderUnits declares it ([Note: parameter roles]); the names are
  // the same at every tensor-parallel size.
  std::unordered_map<std::string, ParamRole> roles;
  const StatusOr<std::vector<DecoderUnit>> units = DecoderUnits(config, 1, 0);
  ZR_CHECK(units.ok()) << "the decoder's initialiser: " << units.status();
  for (const DecoderUnit& u : *units) {
    for (size_t i = 0; i < u.params.size(); ++i) roles.emplace(u.params[i].name, u.roles[i]);
  }
  // Padding rows (a padded vocabulary: frame.valid_rows) start, and stay, zero.
  auto zero_padding = [](const ParamSpec& spec, std::span<float> full) {
    const int64_t real = spec.real_numel();
    if (real == spec.global_numel()) return;
    for (size_t i = 0; i < full.size(); ++i) {
      if (GlobalIndex(spec, static_cast<int64_t>(i)) >= real) full[i] = 0.0f;
    }
  };
  return [residual_std, zero_padding, roles = std::move(roles)](
             const ParamSpec& spec, uint64_t seed, std::span<float> full) {
    const auto role = roles.find(spec.name);
    ZR_CHECK(role != roles.end()) << "the decoder's initialiser: " << spec.name
                                  << " is none of its parameters";
    switch (role->second) {
      case ParamRole::kBias:
        std::fill(full.begin(), full.end(), 0.0f);
        return;
      case ParamRole::kNormGain:
        std::fill(full.begin(), full.end(), 1.0f);
        return;
      case ParamRole::kWeight:
      case ParamRole::kResidualWeight:
        break;
    }
    const double stddev = role->second == ParamRole::kResidualWeight ? residual_std : 0.02;
    const std::string_view name = spec.name;
    const uint64_t key = SplitMix64(seed ^ NameHash(name));
    // Box-Muller on a counter-based generator: the element at global position g depends on
    // (seed, name, g) only, so a tensor-parallel rank's part equals the same elements of the
    // whole tensor initialised at any other tensor-parallel size.
    auto normal_pair = [&](uint64_t pair, double* c, double* s) {
      const double r = std::sqrt(-2.0 * std::log(Unit53(SplitMix64(key + 2 * pair))));
      const double theta = 2.0 * M_PI * Unit53(SplitMix64(key + 2 * pair + 1));
      *c = stddev * r * std::cos(theta);
      *s = stddev * r * std::sin(theta);
    };
    if (spec.frame.split_dim < 0 || spec.frame.parts == 1) {
      for (size_t i = 0; i < full.size(); i += 2) {  // local == global: a pair at a time
        double c, s;
        normal_pair(i / 2, &c, &s);
        full[i] = static_cast<float>(c);
        if (i + 1 < full.size()) full[i + 1] = static_cast<float>(s);
      }
      zero_padding(spec, full);
      return;
    }
    for (size_t i = 0; i < full.size(); ++i) {
      const auto g = static_cast<uint64_t>(GlobalIndex(spec, static_cast<int64_t>(i)));
      double c, s;
      normal_pair(g / 2, &c, &s);
      full[i] = static_cast<float>(g % 2 == 0 ? c : s);
    }
    zero_padding(spec, full);
  };
}

int32_t SampleToken(std::span<const double> logits, const SamplingOptions& options,
                    std::mt19937_64& rng) {
  const int vocab = static_cast<int>(logits.size());
  if (options.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  int keep = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
  // Most likely first; ties broken by the smaller id, so the choice is deterministic.
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const double max = logits[ids[0]];
  std::vector<double> weights(keep);
  double total = 0;
  for (int i = 0; i < keep; ++i) {
    weights[i] = std::exp((logits[ids[i]] - max) / options.temperature);
    total += weights[i];
  }
  double u = Unit53(rng()) * total;
  for (int i = 0; i < keep; ++i) {
    u -= weights[i];
    if (u <= 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace zerort
