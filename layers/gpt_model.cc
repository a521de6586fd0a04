// GptModel: units, initialisation, forward/backward over ModelKernels, sampling.
#include "layers/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/strings.h"

namespace zerort {
namespace {

constexpr int kEmbeddings = 0;
// Parameters of a block unit, in their order in the unit.
enum BlockParam {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
};

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

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The tensors a block's backward needs, in act dtype (statistics in stat dtype).
struct BlockActs {
  Buffer ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};

}  // namespace

StatusOr<ParamSpec> TensorParallelSpec(std::string name, Shape global_shape, bool weight_decay,
                                       TensorSplit split, int tp_size, int tp_rank, int groups) {
  GlobalFrame frame{.split_dim = -1, .parts = tp_size, .part = tp_rank, .groups = groups};
  if (split == TensorSplit::kColumn || split == TensorSplit::kVocab) frame.split_dim = 0;
  if (split == TensorSplit::kRow && global_shape.size() > 1) frame.split_dim = 1;
  return SplitParam(std::move(name), std::move(global_shape), weight_decay, frame);
}

StatusOr<std::vector<GptUnit>> GptUnits(const GptConfig& c, const TensorParallelGroup& tp) {
  if (tp.size() > 1) {
    // The frames below are exact, but the column/row communication does not exist yet.
    return absl::UnimplementedError(StrCat("tensor parallelism (size ", tp.size(),
                                           ") is not yet supported: use tensor_parallel_size 1"));
  }
  return GptUnits(c, 1, 0);
}

StatusOr<std::vector<GptUnit>> GptUnits(const GptConfig& c, int tp_size, int tp_rank) {
  ZR_RETURN_IF_ERROR(c.Validate());
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size || c.n_head % tp_size != 0) {
    return absl::InvalidArgumentError(
        StrCat("tensor-parallel rank ", tp_rank, " of ", tp_size, " for ", c.n_head, " heads"));
  }
  const int64_t d = c.d_model;
  std::vector<GptUnit> units;
  auto param = [&](std::vector<ParamSpec>& out, std::string name, Shape shape, bool decay,
                   TensorSplit split, int groups = 1) -> Status {
    ZR_ASSIGN_OR_RETURN(ParamSpec p, TensorParallelSpec(std::move(name), std::move(shape), decay,
                                                        split, tp_size, tp_rank, groups));
    out.push_back(std::move(p));
    return absl::OkStatus();
  };
  GptUnit emb{"embeddings", {}};
  ZR_RETURN_IF_ERROR(param(emb.params, "wte", {c.vocab_size, d}, true, TensorSplit::kVocab));
  ZR_RETURN_IF_ERROR(param(emb.params, "wpe", {c.seq_len, d}, true, TensorSplit::kReplicated));
  units.push_back(std::move(emb));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = StrCat("blocks.", l, ".");
    GptUnit b{StrCat("blocks.", l), {}};
    using enum TensorSplit;
    ZR_RETURN_IF_ERROR(param(b.params, p + "ln1.weight", {d}, false, kReplicated));
    ZR_RETURN_IF_ERROR(param(b.params, p + "ln1.bias", {d}, false, kReplicated));
    // Fused Q, K, V: split per head (3 stacked blocks), not contiguously.
    ZR_RETURN_IF_ERROR(param(b.params, p + "attn.qkv.weight", {3 * d, d}, true, kColumn, 3));
    ZR_RETURN_IF_ERROR(param(b.params, p + "attn.qkv.bias", {3 * d}, false, kColumn, 3));
    ZR_RETURN_IF_ERROR(param(b.params, p + "attn.proj.weight", {d, d}, true, kRow));
    ZR_RETURN_IF_ERROR(param(b.params, p + "attn.proj.bias", {d}, false, kRow));
    ZR_RETURN_IF_ERROR(param(b.params, p + "ln2.weight", {d}, false, kReplicated));
    ZR_RETURN_IF_ERROR(param(b.params, p + "ln2.bias", {d}, false, kReplicated));
    ZR_RETURN_IF_ERROR(param(b.params, p + "mlp.fc.weight", {4 * d, d}, true, kColumn));
    ZR_RETURN_IF_ERROR(param(b.params, p + "mlp.fc.bias", {4 * d}, false, kColumn));
    ZR_RETURN_IF_ERROR(param(b.params, p + "mlp.proj.weight", {d, 4 * d}, true, kRow));
    ZR_RETURN_IF_ERROR(param(b.params, p + "mlp.proj.bias", {d}, false, kRow));
    units.push_back(std::move(b));
  }
  GptUnit norm{"final_norm", {}};
  ZR_RETURN_IF_ERROR(param(norm.params, "ln_f.weight", {d}, false, TensorSplit::kReplicated));
  ZR_RETURN_IF_ERROR(param(norm.params, "ln_f.bias", {d}, false, TensorSplit::kReplicated));
  units.push_back(std::move(norm));
  return units;
}

Initializer GptInitializer(const GptConfig& config) {
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  return [residual_std](const ParamSpec& spec, uint64_t seed, std::span<float> full) {
    const std::string_view name = spec.name;
    if (EndsWith(name, ".bias")) {
      std::fill(full.begin(), full.end(), 0.0f);
      return;
    }
    if (EndsWith(name, "ln1.weight") || EndsWith(name, "ln2.weight") || name == "ln_f.weight") {
      std::fill(full.begin(), full.end(), 1.0f);
      return;
    }
    const bool residual = EndsWith(name, "attn.proj.weight") || EndsWith(name, "mlp.proj.weight");
    const double stddev = residual ? residual_std : 0.02;
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
      return;
    }
    for (size_t i = 0; i < full.size(); ++i) {
      const auto g = static_cast<uint64_t>(GlobalIndex(spec, static_cast<int64_t>(i)));
      double c, s;
      normal_pair(g / 2, &c, &s);
      full[i] = static_cast<float>(g % 2 == 0 ? c : s);
    }
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

struct GptModel::Pass {
  Pass(int batch, int seq) : batch(batch), seq(seq) {}
  int batch = 0, seq = 0;
  Buffer tokens, targets;          // int32 [batch, seq]
  std::vector<Buffer> block_out;   // [0] embeddings output, [l + 1] output of block l
  std::vector<BlockActs> acts;     // one per block, or a single reused set
  Buffer lnf, lnf_mean, lnf_rstd;  // final LayerNorm
  Buffer logits;                   // [batch, seq, vocab]; the loss gradient replaces it
  Buffer losses;                   // [batch, seq] stat dtype
  int64_t logits_from_row = 0;     // rows copied out by Run when logits are asked for
};

GptModel::GptModel(const GptModelOptions& options, WeightStore& store, ModelKernels& kernels,
                   Allocator& activations)
    : options_(options), store_(store), kernels_(kernels), activations_(activations) {}

GptModel::~GptModel() = default;

StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptModelOptions& options,
                                                     WeightStore& store, ModelKernels& kernels,
                                                     Allocator& activations) {
  if (options.micro_batch < 1) {
    return absl::InvalidArgumentError(StrCat("micro_batch ", options.micro_batch, " is below 1"));
  }
  if (activations.device() != kernels.device()) {
    return absl::InvalidArgumentError(StrCat("activations on ", activations.device().ToString(),
                                             " but kernels on ", kernels.device().ToString()));
  }
  ZR_ASSIGN_OR_RETURN(std::vector<GptUnit> units, GptUnits(options.config, options.tp));
  for (const GptUnit& u : units) ZR_RETURN_IF_ERROR(store.AddUnit(u.name, u.params));
  return std::unique_ptr<GptModel>(new GptModel(options, store, kernels, activations));
}

namespace {

Status CheckTokens(std::span<const int32_t> ids, const char* what, int64_t expected, int vocab) {
  if (static_cast<int64_t>(ids.size()) != expected) {
    return absl::InvalidArgumentError(
        StrCat(what, ": ", ids.size(), " ids given, batch x seq = ", expected, " expected"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          StrCat(what, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// Issues a block's forward: x -> out, saving what the backward needs in `a`.
Status BlockForward(ModelKernels& k, const std::vector<void*>& w, const void* x, BlockActs& a,
                    void* out, int batch, int seq, const GptConfig& c) {
  const int64_t rows = static_cast<int64_t>(batch) * seq;
  const int d = c.d_model;
  ZR_RETURN_IF_ERROR(k.LayerNorm(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w[kLn1W],
                                 w[kLn1B], rows, d));
  ZR_RETURN_IF_ERROR(k.Matmul(a.qkv.data(), a.ln1.data(), w[kQkvW], w[kQkvB], rows, d, 3 * d));
  ZR_RETURN_IF_ERROR(
      k.Attention(a.atty.data(), a.att.data(), a.qkv.data(), batch, seq, d, c.n_head));
  ZR_RETURN_IF_ERROR(k.Matmul(a.res2.data(), a.atty.data(), w[kProjW], w[kProjB], rows, d, d));
  // Tensor parallelism: the row-parallel projection's partial sums are all-reduced here.
  ZR_RETURN_IF_ERROR(k.Add(a.res2.data(), a.res2.data(), x, rows * d));
  ZR_RETURN_IF_ERROR(k.LayerNorm(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                                 w[kLn2W], w[kLn2B], rows, d));
  ZR_RETURN_IF_ERROR(k.Matmul(a.fch.data(), a.ln2.data(), w[kFcW], w[kFcB], rows, d, 4 * d));
  ZR_RETURN_IF_ERROR(k.Gelu(a.fch_gelu.data(), a.fch.data(), rows * 4 * d));
  ZR_RETURN_IF_ERROR(k.Matmul(out, a.fch_gelu.data(), w[kFcProjW], w[kFcProjB], rows, 4 * d, d));
  // Tensor parallelism: and the MLP projection's here.
  return k.Add(out, out, a.res2.data(), rows * d);
}

// Scratch of the backward: gradients of activations (kWorkspace).
struct BackwardScratch {
  Buffer dres;  // [rows, d]: the gradient flowing down the residual stream
  Buffer dbtc;  // [rows, d]
  Buffer d4a;   // [rows, 4d]
  Buffer d4b;   // [rows, 4d]
};

// A block's backward: dres holds d(out) on entry and d(x) on return; weight gradients are added.
Status BlockBackward(ModelKernels& k, const UnitTensors& u, const void* x, const BlockActs& a,
                     BackwardScratch& s, int batch, int seq, const GptConfig& c) {
  const int64_t rows = static_cast<int64_t>(batch) * seq;
  const int d = c.d_model;
  const Device dev = k.device();
  Stream* st = &k.stream();
  const std::vector<void*>& w = u.params;
  const std::vector<void*>& g = u.grads;
  const size_t act = k.act_size();
  // Tensor parallelism: a column-parallel layer's input gradient is all-reduced after each of
  // the two LayerNorm backwards' inputs (dbtc below) is complete.
  ZR_RETURN_IF_ERROR(FillZero(s.d4a.data(), dev, rows * 4 * d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.d4a.data(), g[kFcProjW], g[kFcProjB], s.dres.data(),
                                      a.fch_gelu.data(), w[kFcProjW], rows, 4 * d, d));
  ZR_RETURN_IF_ERROR(FillZero(s.d4b.data(), dev, rows * 4 * d * act, st));
  ZR_RETURN_IF_ERROR(k.GeluBackward(s.d4b.data(), a.fch.data(), s.d4a.data(), rows * 4 * d));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, rows * d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), g[kFcW], g[kFcB], s.d4b.data(), a.ln2.data(),
                                      w[kFcW], rows, d, 4 * d));
  ZR_RETURN_IF_ERROR(k.LayerNormBackward(s.dres.data(), g[kLn2W], g[kLn2B], s.dbtc.data(),
                                         a.res2.data(), w[kLn2W], a.ln2_mean.data(),
                                         a.ln2_rstd.data(), rows, d));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, rows * d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), g[kProjW], g[kProjB], s.dres.data(),
                                      a.atty.data(), w[kProjW], rows, d, d));
  ZR_RETURN_IF_ERROR(FillZero(s.d4a.data(), dev, rows * 3 * d * act, st));
  ZR_RETURN_IF_ERROR(k.AttentionBackward(s.d4a.data(), s.dbtc.data(), a.qkv.data(), a.att.data(),
                                         batch, seq, d, c.n_head));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, rows * d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), g[kQkvW], g[kQkvB], s.d4a.data(), a.ln1.data(),
                                      w[kQkvW], rows, d, 3 * d));
  return k.LayerNormBackward(s.dres.data(), g[kLn1W], g[kLn1B], s.dbtc.data(), x, w[kLn1W],
                             a.ln1_mean.data(), a.ln1_rstd.data(), rows, d);
}

}  // namespace

StatusOr<double> GptModel::Run(Pass& pass, std::span<const int32_t> tokens,
                               std::span<const int32_t> targets, bool train, float loss_scale,
                               std::vector<double>* logits) {
  const GptConfig& c = options_.config;
  const int batch = pass.batch, seq = pass.seq;
  if (batch < 1 || batch > options_.micro_batch || seq < 1 || seq > c.seq_len) {
    return absl::InvalidArgumentError(StrCat("batch x seq = ", batch, " x ", seq, " is outside 1..",
                                             options_.micro_batch, " x 1..", c.seq_len));
  }
  const int64_t rows = static_cast<int64_t>(batch) * seq;
  const int d = c.d_model;
  const int L = c.n_layer;
  ZR_RETURN_IF_ERROR(CheckTokens(tokens, "tokens", rows, c.vocab_size));
  if (!targets.empty()) ZR_RETURN_IF_ERROR(CheckTokens(targets, "targets", rows, c.vocab_size));
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  const Device dev = k.device();
  const size_t act = k.act_size(), stat = k.stat_size();
  auto alloc = [&](Buffer& b, int64_t elems, size_t size,
                   MemoryCategory cat = MemoryCategory::kActivations) -> Status {
    ZR_ASSIGN_OR_RETURN(b, activations_.Allocate(static_cast<size_t>(elems) * size, cat, st));
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(alloc(pass.tokens, rows, sizeof(int32_t)));
  ZR_RETURN_IF_ERROR(
      CopyBytes(pass.tokens.data(), dev, tokens.data(), Device::Cpu(), rows * sizeof(int32_t), st));
  if (!targets.empty()) {
    ZR_RETURN_IF_ERROR(alloc(pass.targets, rows, sizeof(int32_t)));
    ZR_RETURN_IF_ERROR(CopyBytes(pass.targets.data(), dev, targets.data(), Device::Cpu(),
                                 rows * sizeof(int32_t), st));
  }
  // A set per block when the backward follows without recomputation; otherwise one, reused.
  const bool per_block = train && !options_.activation_checkpointing;
  pass.acts.resize(per_block ? L : 1);
  for (BlockActs& a : pass.acts) {
    ZR_RETURN_IF_ERROR(alloc(a.ln1, rows * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.ln1_mean, rows, stat));
    ZR_RETURN_IF_ERROR(alloc(a.ln1_rstd, rows, stat));
    ZR_RETURN_IF_ERROR(alloc(a.qkv, rows * 3 * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.atty, rows * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.att, static_cast<int64_t>(batch) * c.n_head * seq * seq, act));
    ZR_RETURN_IF_ERROR(alloc(a.res2, rows * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.ln2, rows * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.ln2_mean, rows, stat));
    ZR_RETURN_IF_ERROR(alloc(a.ln2_rstd, rows, stat));
    ZR_RETURN_IF_ERROR(alloc(a.fch, rows * 4 * d, act));
    ZR_RETURN_IF_ERROR(alloc(a.fch_gelu, rows * 4 * d, act));
  }
  pass.block_out.resize(L + 1);
  for (Buffer& b : pass.block_out) ZR_RETURN_IF_ERROR(alloc(b, rows * d, act));

  // Forward.
  {
    ZR_ASSIGN_OR_RETURN(UnitTensors emb, store_.Open(kEmbeddings, false));
    ZR_RETURN_IF_ERROR(k.Embedding(pass.block_out[0].data(), pass.tokens.as<int32_t>(),
                                   emb.params[0], emb.params[1], batch, seq, d));
    ZR_RETURN_IF_ERROR(store_.Close(kEmbeddings));
  }
  for (int l = 0; l < L; ++l) {
    ZR_ASSIGN_OR_RETURN(UnitTensors block, store_.Open(1 + l, false));
    ZR_RETURN_IF_ERROR(BlockForward(k, block.params, pass.block_out[l].data(),
                                    pass.acts[per_block ? l : 0], pass.block_out[l + 1].data(),
                                    batch, seq, c));
    ZR_RETURN_IF_ERROR(store_.Close(1 + l));
  }
  const int norm_unit = L + 1;
  ZR_RETURN_IF_ERROR(alloc(pass.lnf, rows * d, act));
  ZR_RETURN_IF_ERROR(alloc(pass.lnf_mean, rows, stat));
  ZR_RETURN_IF_ERROR(alloc(pass.lnf_rstd, rows, stat));
  {
    ZR_ASSIGN_OR_RETURN(UnitTensors norm, store_.Open(norm_unit, false));
    ZR_RETURN_IF_ERROR(k.LayerNorm(pass.lnf.data(), pass.lnf_mean.data(), pass.lnf_rstd.data(),
                                   pass.block_out[L].data(), norm.params[0], norm.params[1], rows,
                                   d));
    ZR_RETURN_IF_ERROR(store_.Close(norm_unit));
  }
  // The output projection, tied to the token embedding (vocabulary-parallel under TP).
  ZR_ASSIGN_OR_RETURN(UnitTensors head, store_.Open(kEmbeddings, train));
  ZR_RETURN_IF_ERROR(alloc(pass.logits, rows * c.vocab_size, act));
  ZR_RETURN_IF_ERROR(k.Matmul(pass.logits.data(), pass.lnf.data(), head.params[0], nullptr, rows, d,
                              c.vocab_size));
  if (logits != nullptr) {
    const int64_t from = pass.logits_from_row;
    logits->resize(static_cast<size_t>((rows - from) * c.vocab_size));
    ZR_RETURN_IF_ERROR(
        k.ActToHost(static_cast<std::byte*>(pass.logits.data()) + from * c.vocab_size * act,
                    (rows - from) * c.vocab_size, logits->data()));
  }
  double loss = 0;
  if (!targets.empty()) {
    ZR_RETURN_IF_ERROR(alloc(pass.losses, rows, stat));
    ZR_RETURN_IF_ERROR(k.CrossEntropy(pass.logits.data(), pass.losses.data(),
                                      pass.targets.as<int32_t>(), rows, c.vocab_size,
                                      train ? loss_scale : 0.0f));
    std::vector<double> host(rows);
    ZR_RETURN_IF_ERROR(k.StatToHost(pass.losses.data(), rows, host.data()));
    for (double v : host) loss += v;
    loss /= static_cast<double>(rows);
  }
  if (!train) {
    ZR_RETURN_IF_ERROR(store_.Close(kEmbeddings));
    return loss;
  }

  // Backward. The embeddings unit stays open until the input embedding's gradient is added.
  BackwardScratch s;
  const auto ws = MemoryCategory::kWorkspace;
  ZR_RETURN_IF_ERROR(alloc(s.dres, rows * d, act, ws));
  ZR_RETURN_IF_ERROR(alloc(s.dbtc, rows * d, act, ws));
  ZR_RETURN_IF_ERROR(FillZero(s.dbtc.data(), dev, rows * d * act, st));
  ZR_RETURN_IF_ERROR(k.MatmulBackward(s.dbtc.data(), head.grads[0], nullptr, pass.logits.data(),
                                      pass.lnf.data(), head.params[0], rows, d, c.vocab_size));
  pass.logits.Reset();
  {
    ZR_ASSIGN_OR_RETURN(UnitTensors norm, store_.Open(norm_unit, true));
    ZR_RETURN_IF_ERROR(FillZero(s.dres.data(), dev, rows * d * act, st));
    ZR_RETURN_IF_ERROR(k.LayerNormBackward(s.dres.data(), norm.grads[0], norm.grads[1],
                                           s.dbtc.data(), pass.block_out[L].data(), norm.params[0],
                                           pass.lnf_mean.data(), pass.lnf_rstd.data(), rows, d));
    ZR_RETURN_IF_ERROR(store_.Close(norm_unit));
  }
  ZR_RETURN_IF_ERROR(alloc(s.d4a, rows * 4 * d, act, ws));
  ZR_RETURN_IF_ERROR(alloc(s.d4b, rows * 4 * d, act, ws));
  for (int l = L - 1; l >= 0; --l) {
    ZR_ASSIGN_OR_RETURN(UnitTensors block, store_.Open(1 + l, true));
    BlockActs& a = pass.acts[per_block ? l : 0];
    if (!per_block) {
      // Recompute: the block's output is written again with the same values.
      ZR_RETURN_IF_ERROR(BlockForward(k, block.params, pass.block_out[l].data(), a,
                                      pass.block_out[l + 1].data(), batch, seq, c));
    }
    ZR_RETURN_IF_ERROR(BlockBackward(k, block, pass.block_out[l].data(), a, s, batch, seq, c));
    ZR_RETURN_IF_ERROR(store_.Close(1 + l));
  }
  ZR_RETURN_IF_ERROR(k.EmbeddingBackward(head.grads[0], head.grads[1], s.dres.data(),
                                         pass.tokens.as<int32_t>(), batch, seq, d));
  ZR_RETURN_IF_ERROR(store_.Close(kEmbeddings));
  return loss;
}

StatusOr<double> GptModel::ForwardBackward(std::span<const int32_t> tokens,
                                           std::span<const int32_t> targets, int batch, int seq,
                                           float loss_scale) {
  Pass pass(batch, seq);
  if (targets.empty()) return absl::InvalidArgumentError("ForwardBackward needs targets");
  return Run(pass, tokens, targets, true, loss_scale, nullptr);
}

StatusOr<double> GptModel::Loss(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int batch, int seq) {
  Pass pass(batch, seq);
  if (targets.empty()) return absl::InvalidArgumentError("Loss needs targets");
  return Run(pass, tokens, targets, false, 0.0f, nullptr);
}

StatusOr<std::vector<double>> GptModel::Logits(std::span<const int32_t> tokens, int batch,
                                               int seq) {
  Pass pass(batch, seq);
  std::vector<double> out;
  ZR_RETURN_IF_ERROR(Run(pass, tokens, {}, false, 0.0f, &out).status());
  return out;
}

StatusOr<std::vector<int32_t>> GptModel::Generate(std::vector<int32_t> prompt, int new_tokens,
                                                  const SamplingOptions& sampling) {
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (new_tokens < 0) return absl::InvalidArgumentError("Generate: new_tokens is negative");
  std::mt19937_64 rng(sampling.seed);
  for (int i = 0; i < new_tokens; ++i) {
    const int seq = std::min<int>(static_cast<int>(prompt.size()), options_.config.seq_len);
    Pass pass(1, seq);
    pass.logits_from_row = seq - 1;  // only the last position is needed
    std::vector<double> last;
    ZR_RETURN_IF_ERROR(Run(pass, std::span(prompt).last(seq), {}, false, 0.0f, &last).status());
    prompt.push_back(SampleToken(last, sampling, rng));
  }
  return prompt;
}

}  // namespace zerort
