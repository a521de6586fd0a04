// DecoderModel::Create (the model's units on its weight store) and DecoderStages: forward and
// backward over ModelKernels in stage calls (the parameter list, initialisation and sampling are
// decoder_params.cc; DecoderModel's whole-model passes decoder_model_passes.cc).
#include "zerort/layers/decoder_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "zerort/layers/decoder_block.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/layers/tp_layers.h"
#include "zerort/runtime/scoped_seconds.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

using namespace decoder;  // the block layers (decoder_block.h)

constexpr int kEmbeddings = 0;
// The automatic head chunk: rows per model channel (HeadChunkRows).
constexpr int64_t kHeadChunkPerChannel = 2;

// The tensors a block's backward needs, in act dtype (statistics in stat dtype).

}  // namespace

DecoderStages::DecoderStages(const DecoderModelOptions& options, WeightStore& store,
                             ModelKernels& kernels, Allocator& activations)
    : options_(options), store_(store), kernels_(kernels), activations_(activations) {}

DecoderModel::DecoderModel(std::unique_ptr<DecoderStages> stages) : stages_(std::move(stages)) {}

DecoderModel::~DecoderModel() = default;

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Create(const DecoderModelOptions& options,
                                                             WeightStore& store,
                                                             ModelKernels& kernels,
                                                             Allocator& activations) {
  if (options.micro_batch < 1) {
    return absl::InvalidArgumentError(StrCat("micro_batch ", options.micro_batch, " is below 1"));
  }
  if (activations.device() != kernels.device()) {
    return absl::InvalidArgumentError(StrCat("activations on ", activations.device().ToString(),
                                             " but kernels on ", kernels.device().ToString()));
  }
  // The store's weights and gradients are read and written by the kernels in their own formats.
  auto same = [](std::optional<DType> a, std::optional<DType> b) -> std::string {
    if (a == b) return "";
    return StrCat(a ? DTypeName(*a) : "f64", " and ", b ? DTypeName(*b) : "f64");
  };
  if (const std::string p = same(store.param_dtype(), kernels.act_dtype()); !p.empty()) {
    return absl::InvalidArgumentError(
        StrCat("the weight store's parameters and the kernels' activations differ: ", p));
  }
  if (const std::string g = same(store.grad_dtype(), kernels.grad_dtype()); !g.empty()) {
    return absl::InvalidArgumentError(
        StrCat("the weight store's gradients and the kernels' weight gradients differ: ", g));
  }
  // The kernels must run where the weights are ready: a gather's event orders the store's stream,
  // not another one (on a GPU, or on queued CPU streams, other work would read half-gathered
  // weights).
  if (Stream* ready = store.stream();
      ready != nullptr && ready->asynchronous() && ready != &kernels.stream()) {
    return absl::InvalidArgumentError(StrCat(
        "the kernels issue on stream '", kernels.stream().name(),
        "' but the weight store's weights are ready on the asynchronous stream '", ready->name(),
        "': create the kernels on it (MakeCpuModelKernels(precision, "
        "&manager.compute_stream()), or MakeCudaModelKernels(..., "
        "manager.compute_stream(), ...))"));
  }
  if (options.tp.size() > 1 || !options.stage.first || !options.stage.last) {
    // Tensor parallelism's collectives and a pipeline stage's sends carry the kernels' own
    // element types (never guessed from a size: fp16 and bf16 are both 2 bytes).
    ZR_RETURN_IF_ERROR(CollectiveDType(kernels.act_dtype(), "activations").status());
    ZR_RETURN_IF_ERROR(CollectiveDType(kernels.grad_dtype(), "weight gradients").status());
    ZR_RETURN_IF_ERROR(CollectiveDType(kernels.stat_dtype(), "statistics").status());
  }
  const DecoderStagePart& part = options.stage;
  const int L = options.config.n_layer;
  int previous_end = -1;
  for (const auto& [first, last] : part.chunks) {
    if (first < 0 || first >= last || last > L || first < previous_end) {
      return absl::InvalidArgumentError(StrCat("stage chunk of blocks [", first, ", ", last,
                                               ") is empty, out of 0..", L, " or out of order"));
    }
    previous_end = last;
  }
  ZR_ASSIGN_OR_RETURN(
      std::vector<DecoderUnit> units,
      DecoderUnits(options.config, options.tp.size(), options.tp.rank(), options.vocab_multiple));
  std::unique_ptr<DecoderStages> stages(new DecoderStages(options, store, kernels, activations));
  stages->block_unit_.assign(L, -1);
  int next = 0;
  const bool tied_head = options.config.tied();
  if (part.first || (part.last && tied_head)) {
    // The first stage counts the tied embedding in the norm; the last one's copy is its twin.
    const bool tied = tied_head && part.embedding_group != nullptr && !(part.first && part.last);
    const UnitOptions emb{.tied = tied ? part.embedding_group : nullptr,
                          .counts_in_norm = part.first};
    ZR_RETURN_IF_ERROR(store.AddUnit(units[kEmbeddings].name, units[kEmbeddings].params, emb));
    stages->embedding_unit_ = next++;
  }
  for (int l = 0; l < L; ++l) {
    if (!part.holds(l)) continue;
    ZR_RETURN_IF_ERROR(store.AddUnit(units[1 + l].name, units[1 + l].params));
    stages->block_unit_[l] = next++;
  }
  if (part.last) {
    ZR_RETURN_IF_ERROR(store.AddUnit(units[L + 1].name, units[L + 1].params));
    stages->norm_unit_ = next++;
    if (!tied_head) {  // the output projection's own unit (untied LLaMA models)
      ZR_RETURN_IF_ERROR(store.AddUnit(units[L + 2].name, units[L + 2].params));
      stages->head_unit_ = next++;
    }
  }
  return std::unique_ptr<DecoderModel>(new DecoderModel(std::move(stages)));
}

std::vector<int> DecoderModel::UnitPositions() const {
  const DecoderStages& s = *stages_;
  const int L = s.options_.config.n_layer;
  std::vector<int> positions(static_cast<size_t>(L + 3), -1);
  if (s.embedding_unit_ >= 0) positions[s.embedding_unit_] = 0;
  for (int l = 0; l < L; ++l) {
    if (s.block_unit_[l] >= 0) positions[s.block_unit_[l]] = 1 + l;
  }
  if (s.norm_unit_ >= 0) positions[s.norm_unit_] = L + 1;
  if (s.head_unit_ >= 0) positions[s.head_unit_] = L + 2;
  while (!positions.empty() && positions.back() < 0) positions.pop_back();
  return positions;
}

bool DecoderStagePart::holds(int block) const {
  if (chunks.empty()) return true;
  for (const auto& [first, last] : chunks) {
    if (block >= first && block < last) return true;
  }
  return false;
}

namespace {

// `ignore`: kIgnoreTarget is allowed (a target whose loss is masked).
Status CheckTokens(std::span<const int32_t> ids, const char* what, int64_t expected, int vocab,
                   bool ignore = false) {
  if (static_cast<int64_t>(ids.size()) != expected) {
    return absl::InvalidArgumentError(
        StrCat(what, ": ", ids.size(), " ids given, batch x seq = ", expected, " expected"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ignore && ids[i] == kIgnoreTarget) continue;
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          StrCat(what, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// [Note: a micro-batch's phase] Each stage call checks the phase it needs and moves it on, as
// ShardState does for a unit; a call out of order is FailedPrecondition naming both.
//   kForward       Begin; EmbedForward and BlocksForward keep it here.
//   kHeadDone      an evaluation's HeadForward ran: nothing follows (the losses are read).
//   kHeadBackward  a training HeadForward ran (it also prepared the head's backward).
//   kBackward      HeadBackward ran, or a stage without the head began its backward with the
//                  next stage's gradient (BlocksBackward with dout); further BlocksBackward.
//   kDone          EmbedBackward ran: the micro-batch's gradients are all accumulated.
enum class MicroBatchPhase { kForward, kHeadDone, kHeadBackward, kBackward, kDone };

std::string_view MicroBatchPhaseName(MicroBatchPhase p) {
  switch (p) {
    case MicroBatchPhase::kForward:
      return "forward";
    case MicroBatchPhase::kHeadDone:
      return "evaluated";
    case MicroBatchPhase::kHeadBackward:
      return "awaiting HeadBackward";
    case MicroBatchPhase::kBackward:
      return "backward";
    case MicroBatchPhase::kDone:
      return "done";
  }
  return "?";
}

// One micro-batch on this rank: its activations (kept from its forward to its backward), the
// tied head's weights while they are open, and the backward's scratch.
struct DecoderStages::MicroBatch {
  MicroBatch(const Geometry& g, const TpContext& tp) : g(g), tp(tp) {}
  Geometry g;
  TpContext tp;
  bool train = false;
  bool per_block = false;          // a set per block (no recomputation)
  Buffer tokens, targets;          // int32 [batch, seq]
  std::vector<int64_t> ignored;    // rows whose target is masked ([Note: masked targets])
  std::vector<Buffer> block_out;   // [0] embeddings output, [l + 1] output of block l (this
                                   // rank's rows under sequence parallelism)
  std::vector<BlockActs> acts;     // one per block, or a single reused set
  Buffer lnf, lnf_mean, lnf_rstd;  // final LayerNorm: output of every row, this rank's statistics
  Buffer losses;                   // [batch, seq] stat dtype
  Buffer logits;                   // HeadForward's chunk of the logits [chunk, v_l]
  MicroBatchPhase phase = MicroBatchPhase::kForward;  // [Note: a micro-batch's phase]
  Buffer seq_local, seq_full;  // forward scratch of the tensor-parallel collectives
  UnitTensors head;            // the tied embeddings, open from HeadForward to EmbedBackward
  bool head_open = false;      // a resource, not a phase: the tied unit's scope is open
  BackwardScratch s;
  // FailedPrecondition unless the phase is `want` (or `also`).
  Status Need(std::string_view call, MicroBatchPhase want,
              std::optional<MicroBatchPhase> also = std::nullopt) const {
    if (phase == want || (also && phase == *also)) return absl::OkStatus();
    return absl::FailedPreconditionError(StrCat(call, " on a micro-batch in phase '",
                                                MicroBatchPhaseName(phase), "' (it needs '",
                                                MicroBatchPhaseName(want), "')"));
  }
  Ctx ctx(ModelKernels& k) { return Ctx{k, tp, g, seq_local.data(), seq_full.data()}; }
  // The buffer a plan row names ([Note: a micro-batch's buffers]).
  Buffer& Slot(const MbPlanned& p) {
    switch (p.buffer) {
      case MbBuffer::kTokens:
        return tokens;
      case MbBuffer::kTargets:
        return targets;
      case MbBuffer::kBoundary:
        return block_out.at(static_cast<size_t>(p.index));
      case MbBuffer::kSeqLocal:
        return seq_local;
      case MbBuffer::kSeqFull:
        return seq_full;
      case MbBuffer::kLnf:
        return lnf;
      case MbBuffer::kLnfMean:
        return lnf_mean;
      case MbBuffer::kLnfRstd:
        return lnf_rstd;
      case MbBuffer::kLosses:
        return losses;
      case MbBuffer::kDbtc:
        return s.dbtc;
      case MbBuffer::kLogits:
        return logits;
      case MbBuffer::kBlockActs:
        break;
    }
    ZR_CHECK(false) << "no micro-batch buffer for plan row " << static_cast<int>(p.buffer);
    return tokens;
  }
  // Allocates the plan's rows, in order (kBlockActs: the reused block activation set).
  Status Allocate(const std::vector<MbPlanned>& plan, ModelKernels& k, Allocator& a) {
    for (const MbPlanned& p : plan) {
      if (p.buffer == MbBuffer::kBlockActs) {
        ZR_RETURN_IF_ERROR(AllocateBlockActs(g, k, a, acts.at(0)));
        continue;
      }
      ZR_ASSIGN_OR_RETURN(Slot(p),
                          a.Allocate(static_cast<size_t>(p.bytes), p.category, &k.stream()));
    }
    return absl::OkStatus();
  }
};

void DecoderStages::MicroBatchDeleter::operator()(MicroBatch* mb) const { delete mb; }

StatusOr<DecoderStages::MicroBatchPtr> DecoderStages::Begin(std::span<const int32_t> tokens,
                                                            std::span<const int32_t> targets,
                                                            int batch, int seq, bool train) {
  const DecoderConfig& cfg = options_.config;
  if (batch < 1 || batch > options_.micro_batch || seq < 1 || seq > cfg.seq_len) {
    return absl::InvalidArgumentError(StrCat("batch x seq = ", batch, " x ", seq, " is outside 1..",
                                             options_.micro_batch, " x 1..", cfg.seq_len));
  }
  if (train && targets.empty()) return absl::InvalidArgumentError("training needs targets");
  const Geometry g = MakeGeometry(options_, batch, seq);
  const int64_t rows = g.rows;
  const int L = cfg.n_layer;
  ZR_RETURN_IF_ERROR(CheckTokens(tokens, "tokens", rows, cfg.vocab_size));
  if (!targets.empty()) {
    ZR_RETURN_IF_ERROR(CheckTokens(targets, "targets", rows, cfg.vocab_size, /*ignore=*/true));
  }
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  const Device dev = k.device();
  const size_t act = k.act_size();
  MicroBatchPtr mb(new MicroBatch(g, TpContext{options_.tp, &k, &activations_}));
  mb->train = train;
  // A set per block when the backward follows without recomputation (each allocated by its
  // block's forward and freed by its backward, so a pipeline stage holds only the sets of the
  // chunks in flight); otherwise one, reused, for the whole micro-batch.
  mb->per_block = train && !options_.activation_checkpointing;
  mb->acts.resize(mb->per_block ? L : 1);
  mb->block_out.resize(L + 1);
  ZR_RETURN_IF_ERROR(mb->Allocate(
      BeginPlan(g, options_.stage, L, static_cast<int64_t>(act), !targets.empty(), mb->per_block),
      k, activations_));
  // Taken now: the caller refills its vectors for the next micro-batch while this one's work may
  // still be queued (nothing waits for the stream between micro-batches).
  ZR_RETURN_IF_ERROR(
      CopyFromHostNow(mb->tokens.data(), dev, tokens.data(), rows * sizeof(int32_t), st));
  if (!targets.empty()) {
    // [Note: masked targets] A kIgnoreTarget row goes to the kernels as target 0; HeadForward
    // zeroes its loss and its logits' gradient, and the mean is over the other rows.
    // A copy only when some target is masked (most micro-batches have none).
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == kIgnoreTarget) mb->ignored.push_back(r);
    }
    std::vector<int32_t> substituted;
    if (!mb->ignored.empty()) {
      substituted.assign(targets.begin(), targets.end());
      for (int64_t r : mb->ignored) substituted[r] = 0;
    }
    ZR_RETURN_IF_ERROR(CopyFromHostNow(mb->targets.data(), dev,
                                       substituted.empty() ? targets.data() : substituted.data(),
                                       rows * sizeof(int32_t), st));
  }
  return mb;
}

Status DecoderStages::EmbedForward(MicroBatch& mb) {
  const ScopedSeconds timed(&phase_seconds_.forward);
  // The vocabulary-parallel embedding: each rank looks up the tokens of its rows of wte (zeros
  // for the others), rank 0 adds the positions, and the sum over the group (reduced to this
  // rank's rows under sequence parallelism) is the embedding.
  const Geometry& g = mb.g;
  ZR_RETURN_IF_ERROR(mb.Need("EmbedForward", MicroBatchPhase::kForward));
  if (!options_.stage.first) {
    return absl::FailedPreconditionError("EmbedForward on a stage without the input embedding");
  }
  ZR_ASSIGN_OR_RETURN(UnitTensors emb, store_.Open(embedding_unit_, false));
  void* out = g.sp ? mb.seq_full.data() : mb.block_out[0].data();
  // Positions: GPT-2's wpe (added once, by rank 0); the LLaMA family rotates q and k instead.
  const void* wpe = g.r == 0 && emb.params.size() > 1 ? emb.params[1] : nullptr;
  ZR_RETURN_IF_ERROR(kernels_.Embedding(out, mb.tokens.as<int32_t>(), emb.params[0], wpe, g.batch,
                                        g.seq, g.d, g.v_begin, g.v_valid));
  if (g.sp) {
    ZR_RETURN_IF_ERROR(ScatterToSequence(mb.tp, out, mb.block_out[0].data(), g.rows_l * g.d));
  } else {
    ZR_RETURN_IF_ERROR(ReduceFromRegionForward(mb.tp, out, g.rows * g.d));
  }
  return store_.Close(embedding_unit_);
}

namespace {
Status CheckBlocks(const DecoderStagePart& part, int n_layer, int first, int last) {
  if (first < 0 || first > last || last > n_layer) {
    return absl::InvalidArgumentError(
        StrCat("blocks [", first, ", ", last, ") outside 0..", n_layer));
  }
  for (int l = first; l < last; ++l) {
    if (!part.holds(l)) {
      return absl::FailedPreconditionError(StrCat("block ", l, " is not on this stage"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

Status DecoderStages::BlocksForward(MicroBatch& mb, int first, int last) {
  const ScopedSeconds timed(&phase_seconds_.forward);
  ZR_RETURN_IF_ERROR(CheckBlocks(options_.stage, options_.config.n_layer, first, last));
  ZR_RETURN_IF_ERROR(mb.Need("BlocksForward", MicroBatchPhase::kForward));
  const Ctx c = mb.ctx(kernels_);
  for (int l = first; l < last; ++l) {
    if (mb.per_block)
      ZR_RETURN_IF_ERROR(AllocateBlockActs(mb.g, kernels_, activations_, mb.acts[l]));
    ZR_ASSIGN_OR_RETURN(UnitTensors block, store_.Open(block_unit_[l], false));
    ZR_RETURN_IF_ERROR(BlockForward(c, block.params, mb.block_out[l].data(),
                                    mb.acts[mb.per_block ? l : 0], mb.block_out[l + 1].data()));
    ZR_RETURN_IF_ERROR(store_.Close(block_unit_[l]));
  }
  return absl::OkStatus();
}

void* DecoderStages::BlockInput(MicroBatch& mb, int block) { return mb.block_out.at(block).data(); }

int64_t DecoderStages::BoundaryElements(const MicroBatch& mb) const { return mb.g.rows_l * mb.g.d; }

DType DecoderStages::BoundaryDType() const {
  const std::optional<DType> act = kernels_.act_dtype();
  ZR_CHECK(act.has_value()) << "a pipeline boundary of fp64 kernels (Create refuses them)";
  return *act;
}

int64_t HeadChunkRows(int64_t configured, int64_t rows, int d_model) {
  if (configured > 0) return std::min(configured, rows);
  // Each chunk's weight-gradient GEMM reads and writes the whole [vocab, d] gradient once, while
  // the chunk's logits pass through memory about five times (written by the GEMM, read twice and
  // written by the cross-entropy, read by the two backward GEMMs): with 2 d rows or more that
  // extra pass is a small part of the chunk's traffic. Measured on the CPU
  // (docs/cpu-performance.md): chunks of 2 d rows cost at most 2%, of 128 rows 6% (d 768) to
  // 12% (d 384), of 64 rows 11-20%. The rows are split into equal chunks of at most 2 d.
  const int64_t most = std::max<int64_t>(64, kHeadChunkPerChannel * d_model);
  const int64_t count = (rows + most - 1) / most;
  return (rows + count - 1) / count;
}

StatusOr<double> DecoderStages::HeadForward(MicroBatch& mb, float loss_scale,
                                            std::vector<double>* logits, int64_t logits_from_row) {
  const ScopedSeconds timed(&phase_seconds_.forward);
  if (logits_from_row < 0 || logits_from_row >= mb.g.rows) {
    return absl::InvalidArgumentError(
        StrCat("logits from row ", logits_from_row, " of ", mb.g.rows));
  }
  if (logits != nullptr && logits_from_row > 0 && mb.targets) {
    return absl::InvalidArgumentError("a loss needs the logits of every row (logits_from_row 0)");
  }
  ZR_RETURN_IF_ERROR(mb.Need("HeadForward", MicroBatchPhase::kForward));
  const int64_t from = logits != nullptr ? logits_from_row : 0;  // the first row computed
  const Geometry& g = mb.g;
  const int L = options_.config.n_layer;
  const int norm_unit = norm_unit_;
  if (!options_.stage.last) {
    return absl::FailedPreconditionError("HeadForward on a stage without the head");
  }
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  const Device dev = k.device();
  const size_t act = k.act_size(), stat = k.stat_size();
  // [Note: a micro-batch's buffers]: the final LayerNorm's, then the head's once it is open.
  ZR_RETURN_IF_ERROR(mb.Allocate(
      HeadNormPlan(g, static_cast<int64_t>(act), static_cast<int64_t>(stat)), k, activations_));
  {
    ZR_ASSIGN_OR_RETURN(UnitTensors norm, store_.Open(norm_unit, false));
    ZR_RETURN_IF_ERROR(NormToColumn(mb.ctx(k), mb.lnf.data(), mb.lnf_mean.data(),
                                    mb.lnf_rstd.data(), mb.block_out[L].data(), norm.params[0],
                                    norm.params.size() > 1 ? norm.params[1] : nullptr));
    ZR_RETURN_IF_ERROR(store_.Close(norm_unit));
  }
  // The output projection, tied to the token embedding (or, untied, the head unit's lm_head):
  // column-parallel over the vocabulary. Opened for the backward when training, since each
  // chunk's gradient goes into it at once; a tied one is kept open on a stage that also holds the
  // input embedding, whose gradient completes the unit's in EmbedBackward. A last stage that is
  // not the first closes it here (its gradient meets the first stage's in the tied reduction),
  // and so does an untied head (its gradient is complete).
  const int head_unit = head_unit_ >= 0 ? head_unit_ : embedding_unit_;
  const bool keep_open = mb.train && options_.stage.first && head_unit_ < 0;
  ZR_ASSIGN_OR_RETURN(mb.head, store_.Open(head_unit, mb.train));
  mb.head_open = true;
  BackwardScratch& s = mb.s;
  // One chunk of rows [r0, r0 + n) at a time; the rows asked for in one chunk.
  const int64_t chunk =
      logits != nullptr ? g.rows - from : HeadChunkRows(options_.head_chunk_rows, g.rows, g.d);
  ZR_RETURN_IF_ERROR(mb.Allocate(HeadPlan(g, static_cast<int64_t>(act), static_cast<int64_t>(stat),
                                          static_cast<bool>(mb.targets), mb.train, chunk),
                                 k, activations_));
  // dbtc, when training (always with targets: Begin): the final LayerNorm output's gradient, each
  // chunk writing its rows.
  const Buffer& z = mb.logits;
  // The gradient of loss_scale x the mean over the micro-batch's rows whose target is not masked.
  const int64_t counted = g.rows - static_cast<int64_t>(mb.ignored.size());
  const float dscale = mb.train && counted > 0 ? loss_scale / static_cast<float>(counted) : 0.0f;
  auto at = [](const Buffer& b, int64_t offset, size_t size) {
    return static_cast<std::byte*>(b.data()) + offset * static_cast<int64_t>(size);
  };
  const int32_t* targets = mb.targets ? mb.targets.as<int32_t>() : nullptr;
  for (int64_t r0 = from; r0 < g.rows; r0 += chunk) {
    const int64_t n = std::min(chunk, g.rows - r0);
    const void* x = at(mb.lnf, r0 * g.d, act);
    ZR_RETURN_IF_ERROR(k.Matmul(z.data(), x, mb.head.params[0], nullptr, n, g.d, g.v_l));
    if (logits != nullptr) ZR_RETURN_IF_ERROR(CopyLogits(mb, z, n, logits));
    if (!mb.targets) continue;
    void* losses = at(mb.losses, r0, stat);
    if (g.whole_vocab()) {
      ZR_RETURN_IF_ERROR(
          k.CrossEntropy(z.data(), losses, targets + r0, n, g.v_l, g.v_valid, dscale));
    } else {
      ZR_RETURN_IF_ERROR(VocabParallelCrossEntropy(mb.tp, z.data(), losses, targets + r0, n, g.v_l,
                                                   g.v_valid, g.v_begin, dscale));
    }
    // Masked rows of this chunk: no loss, no gradient (a few per document boundary).
    for (auto it = std::lower_bound(mb.ignored.begin(), mb.ignored.end(), r0);
         it != mb.ignored.end() && *it < r0 + n; ++it) {
      ZR_RETURN_IF_ERROR(FillZero(at(mb.losses, *it, stat), dev, stat, st));
      if (mb.train)
        ZR_RETURN_IF_ERROR(FillZero(at(z, (*it - r0) * g.v_l, act), dev, g.v_l * act, st));
    }
    if (mb.train) {
      ZR_RETURN_IF_ERROR(k.MatmulBackwardWrite(at(s.dbtc, r0 * g.d, act), mb.head.grads[0], nullptr,
                                               z.data(), x, mb.head.params[0], n, g.d, g.v_l));
    }
  }
  mb.logits.Reset();
  double loss = 0;
  if (mb.targets && mb.train && defer_training_loss_) {
    // [Note: the training loss ledger]: added in the stream's order, read once per step.
    ZR_RETURN_IF_ERROR(k.AddToLossLedger(mb.losses.data(), g.rows,
                                         static_cast<double>(std::max<int64_t>(counted, 1))));
  } else if (mb.targets) {
    std::vector<double> host(g.rows);
    ZR_RETURN_IF_ERROR(k.StatToHost(mb.losses.data(), g.rows, host.data()));
    for (double v : host) loss += v;
    loss /= static_cast<double>(std::max<int64_t>(counted, 1));
  }
  mb.phase = mb.train ? MicroBatchPhase::kHeadBackward : MicroBatchPhase::kHeadDone;
  if (!keep_open) {
    mb.head_open = false;
    ZR_RETURN_IF_ERROR(store_.Close(head_unit));
  }
  return loss;
}

Status DecoderStages::HeadBackward(MicroBatch& mb) {
  const ScopedSeconds timed(&phase_seconds_.backward);
  ZR_RETURN_IF_ERROR(mb.Need("HeadBackward", MicroBatchPhase::kHeadBackward));
  mb.phase = MicroBatchPhase::kBackward;
  const Geometry& g = mb.g;
  const int norm_unit = norm_unit_;
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  const Device dev = k.device();
  const size_t act = k.act_size();
  BackwardScratch& s = mb.s;
  ZR_RETURN_IF_ERROR(EnsureBackwardScratch(mb));
  const Ctx c = mb.ctx(k);
  ZR_ASSIGN_OR_RETURN(UnitTensors norm, store_.Open(norm_unit, true));
  ZR_ASSIGN_OR_RETURN(const void* dlnf, ReduceColumnInputGrad(c, s));
  ZR_RETURN_IF_ERROR(FillZero(s.dres.data(), dev, g.rows_l * g.d * act, st));
  ZR_RETURN_IF_ERROR(NormBackward(c, s, 0, dlnf, mb.block_out[options_.config.n_layer].data(),
                                  norm.params, norm.grads, 0, mb.lnf_mean.data(),
                                  mb.lnf_rstd.data()));
  ZR_RETURN_IF_ERROR(
      ReduceNormGrads(c, s, {{norm.grads[0], norm.grads.size() > 1 ? norm.grads[1] : nullptr}}));
  return store_.Close(norm_unit);
}

Status DecoderStages::EnsureBackwardScratch(MicroBatch& mb) {
  BackwardScratch& s = mb.s;
  if (s.dres) return absl::OkStatus();
  const Geometry& g = mb.g;
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  // The forward is over for this micro-batch: its scratch goes.
  mb.seq_local.Reset();
  mb.seq_full.Reset();
  for (const ScratchBuffer& b :
       BackwardScratchPlan(g, static_cast<int64_t>(k.act_size()),
                           static_cast<int64_t>(k.grad_size()), static_cast<bool>(s.dbtc))) {
    ZR_ASSIGN_OR_RETURN(s.*b.member, activations_.Allocate(static_cast<size_t>(b.bytes),
                                                           MemoryCategory::kWorkspace, st));
  }
  if (s.norm) ZR_RETURN_IF_ERROR(FillZero(s.norm.data(), k.device(), s.norm.bytes(), st));
  return absl::OkStatus();
}

Status DecoderStages::BlocksBackward(MicroBatch& mb, int first, int last, const void* dout,
                                     void* dx) {
  const ScopedSeconds timed(&phase_seconds_.backward);
  ZR_RETURN_IF_ERROR(CheckBlocks(options_.stage, options_.config.n_layer, first, last));
  const Geometry& g = mb.g;
  ModelKernels& k = kernels_;
  Stream* st = &k.stream();
  const size_t act = k.act_size();
  const auto ws = MemoryCategory::kWorkspace;
  BackwardScratch& s = mb.s;
  // With the next stage's gradient a stage without the head begins its backward here.
  const bool begins = dout != nullptr && mb.train && mb.phase == MicroBatchPhase::kForward;
  if (!begins) ZR_RETURN_IF_ERROR(mb.Need("BlocksBackward", MicroBatchPhase::kBackward));
  mb.phase = MicroBatchPhase::kBackward;
  if (dout != nullptr) {
    ZR_RETURN_IF_ERROR(EnsureBackwardScratch(mb));
    ZR_RETURN_IF_ERROR(CopyBytes(s.dres.data(), k.device(), dout, k.device(),
                                 static_cast<size_t>(g.rows_l) * g.d * act, st));
  }
  ZR_CHECK(s.dres) << "a micro-batch in its backward has the backward's scratch";
  if (!s.d4a) {
    for (const ScratchBuffer& b : BlockBackwardScratchPlan(g, static_cast<int64_t>(act))) {
      ZR_ASSIGN_OR_RETURN(s.*b.member, activations_.Allocate(static_cast<size_t>(b.bytes), ws, st));
    }
  }
  const Ctx c = mb.ctx(k);
  for (int l = last - 1; l >= first; --l) {
    ZR_ASSIGN_OR_RETURN(UnitTensors block, store_.Open(block_unit_[l], true));
    BlockActs& a = mb.acts[mb.per_block ? l : 0];
    if (!mb.per_block) {
      // Recompute: the block's output is written again with the same values (under sequence
      // parallelism through forward scratch borrowed for the block).
      Buffer scratch[2];  // seq_local, seq_full (SeqScratchPlan)
      int i = 0;
      for (const MbPlanned& p : SeqScratchPlan(g, static_cast<int64_t>(act))) {
        ZR_ASSIGN_OR_RETURN(scratch[i++],
                            activations_.Allocate(static_cast<size_t>(p.bytes), p.category, st));
      }
      const Ctx rc{k, mb.tp, g, scratch[0].data(), scratch[1].data()};
      ZR_RETURN_IF_ERROR(
          BlockForward(rc, block.params, mb.block_out[l].data(), a, mb.block_out[l + 1].data()));
    }
    ZR_RETURN_IF_ERROR(BlockBackward(c, block, mb.block_out[l].data(), a, s));
    ZR_RETURN_IF_ERROR(store_.Close(block_unit_[l]));
    if (mb.per_block) a = BlockActs{};  // its activations are spent
  }
  if (dx != nullptr) {
    ZR_RETURN_IF_ERROR(CopyBytes(dx, k.device(), s.dres.data(), k.device(),
                                 static_cast<size_t>(g.rows_l) * g.d * act, st));
  }
  return absl::OkStatus();
}

Status DecoderStages::EmbedBackward(MicroBatch& mb) {
  const ScopedSeconds timed(&phase_seconds_.backward);
  ZR_RETURN_IF_ERROR(mb.Need("EmbedBackward", MicroBatchPhase::kBackward));
  if (!options_.stage.first) {
    return absl::FailedPreconditionError("EmbedBackward on a stage without the input embedding");
  }
  mb.phase = MicroBatchPhase::kDone;
  if (!mb.head_open) {  // a first stage that is not the last: the embedding's own scope
    ZR_ASSIGN_OR_RETURN(mb.head, store_.Open(embedding_unit_, true));
    mb.head_open = true;
  }
  const Geometry& g = mb.g;
  // The embedding's backward needs the gradient of every row (each rank holds its wte rows).
  ZR_ASSIGN_OR_RETURN(const void* demb, ResidualGradOfEveryRow(mb.ctx(kernels_), mb.s));
  void* dwpe = mb.head.grads.size() > 1 ? mb.head.grads[1] : nullptr;  // GPT-2's positions
  ZR_RETURN_IF_ERROR(kernels_.EmbeddingBackward(mb.head.grads[0], dwpe, demb,
                                                mb.tokens.as<int32_t>(), g.batch, g.seq, g.d,
                                                g.v_begin, g.v_valid));
  mb.head_open = false;
  return store_.Close(embedding_unit_);
}

Status DecoderStages::CopyLogits(MicroBatch& pass, const Buffer& logits, int64_t rows,
                                 std::vector<double>* out) {
  const DecoderConfig& cfg = options_.config;
  ModelKernels& k = kernels_;
  const int tp = pass.g.t, vocab_local = pass.g.v_l;
  const size_t act = k.act_size();
  out->resize(static_cast<size_t>(rows * cfg.vocab_size));
  if (tp == 1 && vocab_local == cfg.vocab_size) {
    return k.ActToHost(logits.data(), rows * vocab_local, out->data());
  }
  // Every rank's columns, gathered ([tp, rows, vocab_local]), then rearranged to rows of the real
  // vocabulary: the padding never leaves this function.
  ZR_ASSIGN_OR_RETURN(Buffer all, activations_.Allocate(tp * rows * vocab_local * act,
                                                        MemoryCategory::kWorkspace, &k.stream()));
  ZR_RETURN_IF_ERROR(GatherFromSequence(pass.tp, logits.data(), all.data(), rows * vocab_local));
  std::vector<double> host(static_cast<size_t>(tp * rows * vocab_local));
  ZR_RETURN_IF_ERROR(k.ActToHost(all.data(), static_cast<int64_t>(host.size()), host.data()));
  for (int64_t row = 0; row < rows; ++row) {
    for (int v = 0; v < cfg.vocab_size; ++v) {
      const int64_t part = v / vocab_local, col = v % vocab_local;
      (*out)[row * cfg.vocab_size + v] = host[(part * rows + row) * vocab_local + col];
    }
  }
  return absl::OkStatus();
}

}  // namespace zerort
