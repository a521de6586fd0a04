// Hugging Face GPT-2 export (safetensors, streamed) and checkpoint evaluation.
#include "zerort/checkpoint/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/checkpoint/config_match.h"
#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/hf_names.h"
#include "zerort/checkpoint/run_dir.h"
#include "zerort/checkpoint/safetensors.h"
#include "zerort/data/data_loader.h"
#include "zerort/data/token_source.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace fs = std::filesystem;

namespace {

struct ShardEntry {
  std::string ours;
  HfName hf;
  Shape shape;  // as written
  int64_t bytes = 0;
};

// One safetensors file of `entries` (their masters in `dtype`), through a FileReplacement renamed
// at the end; every write checked, nothing left on any failure.
Status WriteShard(const std::string& path, const std::vector<ShardEntry>& entries,
                  CheckpointReader& reader, DType dtype, ExportSummary& summary) {
  const char* st_dtype = dtype == DType::kF32 ? "F32" : dtype == DType::kBF16 ? "BF16" : "F16";
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (const ShardEntry& e : entries) {
    header[e.hf.name] = {
        {"dtype", st_dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  header["__metadata__"] = {{"format", "pt"}, {"source", "zerort checkpoint export"}};
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data aligned to 8 bytes
  ZR_ASSIGN_OR_RETURN(FileReplacement file, FileReplacement::Begin(path, "checkpoint export"));
  auto write_all = [&](const void* data, size_t bytes) {
    return file.Write(std::string_view(static_cast<const char*>(data), bytes));
  };
  const uint64_t header_size = text.size();
  char size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  ZR_RETURN_IF_ERROR(write_all(size_bytes, 8));
  ZR_RETURN_IF_ERROR(write_all(text.data(), text.size()));
  for (const ShardEntry& e : entries) {  // one parameter in memory at a time
    ZR_ASSIGN_OR_RETURN(std::vector<float> v, reader.ReadAll(e.ours, "master"));
    if (e.hf.transpose) {
      const int64_t rows = e.shape[1], cols = e.shape[0];  // ours: [rows = out, cols = in]
      std::vector<float> t(v.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
      }
      v.swap(t);
    }
    if (dtype == DType::kF32) {
      ZR_RETURN_IF_ERROR(write_all(v.data(), v.size() * 4));
    } else {
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        bits[i] = dtype == DType::kBF16 ? FloatToBf16Bits(v[i]) : FloatToF16Bits(v[i]);
      }
      ZR_RETURN_IF_ERROR(write_all(bits.data(), bits.size() * 2));
    }
    ++summary.tensors;
    summary.bytes += e.bytes;
  }
  return file.Commit();
}

// The model on one process at stage 0 on the CPU with plain SGD (no moments): what reads or
// writes a checkpoint's master weights whatever layout saved it (EvaluateCheckpoint,
// ImportHuggingFace).
struct OneProcessModel {
  std::vector<std::unique_ptr<Communicator>> group;
  MemoryTracker tracker;
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<ShardManager> manager;
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<ModelKernels> kernels;
  std::unique_ptr<DecoderModel> model;
  CheckpointGroups groups() const { return {.world = group[0].get(), .dp = group[0].get()}; }
};

StatusOr<std::unique_ptr<OneProcessModel>> MakeOneProcessModel(const DecoderConfig& shape,
                                                               int micro_batch) {
  auto m = std::make_unique<OneProcessModel>();
  ZR_ASSIGN_OR_RETURN(m->group, CreateLoopbackGroup(1, {}, nullptr));
  m->allocator = MakeCpuCachingAllocator(&m->tracker);
  ShardManagerOptions o;
  o.stage = ZeroStage::k0;
  o.optimizer.kind = OptimizerKind::kSgd;
  ZR_ASSIGN_OR_RETURN(
      m->manager,
      ShardManager::Create(o, {.dp = m->group[0].get(), .device_allocator = m->allocator.get()}));
  m->store = MakeShardManagerStore(*m->manager);
  m->kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
  ZR_ASSIGN_OR_RETURN(m->model, DecoderModel::Create({.config = shape, .micro_batch = micro_batch},
                                                     *m->store, *m->kernels, *m->allocator));
  return m;
}

// `ours` (the config.json zerort writes for a checkpoint) over `saved` (the one the weights were
// imported from): the shape, the norms' epsilon, the rotary base, the head's tie and the dtype
// are the checkpoint's; the context is the longer of the two; every other key is the saved file's.
nlohmann::json MergeImportedConfig(const nlohmann::json& saved, const nlohmann::json& ours) {
  nlohmann::json out = saved;
  static const char* const kOwned[] = {"vocab_size",
                                       "hidden_size",
                                       "intermediate_size",
                                       "num_hidden_layers",
                                       "num_attention_heads",
                                       "num_key_value_heads",
                                       "rms_norm_eps",
                                       "tie_word_embeddings",
                                       "torch_dtype",
                                       "n_embd",
                                       "n_layer",
                                       "n_head",
                                       "n_positions",
                                       "n_ctx"};
  for (const char* key : kOwned) {
    if (ours.contains(key)) out[key] = ours.at(key);
  }
  // rope_theta: where the saved file keeps it (transformers 5: inside rope_parameters).
  if (ours.contains("rope_theta")) {
    if (out.contains("rope_parameters") && out.at("rope_parameters").is_object() &&
        !out.contains("rope_theta")) {
      out["rope_parameters"]["rope_theta"] = ours.at("rope_theta");
    } else {
      out["rope_theta"] = ours.at("rope_theta");
    }
  }
  if (ours.contains("max_position_embeddings")) {
    const nlohmann::json was = saved.value("max_position_embeddings", nlohmann::json());
    const nlohmann::json& trained = ours.at("max_position_embeddings");
    const bool longer = was.is_number_integer() && trained.is_number_integer() &&
                        was.get<int64_t>() >= trained.get<int64_t>();
    out["max_position_embeddings"] = longer ? was : trained;
  }
  return out;
}

// The config.json of a zerort model config's `model` section (transformers' keys for the
// architecture it is); a LLaMA-family block whose biases no Hugging Face architecture has is
// refused naming the flags.
StatusOr<nlohmann::json> HuggingFaceConfigOf(const nlohmann::json& model, ModelArch arch,
                                             DType dtype) {
  const char* torch_dtype = dtype == DType::kF32    ? "float32"
                            : dtype == DType::kBF16 ? "bfloat16"
                                                    : "float16";
  nlohmann::json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", model.at("vocab_size")},
      {"n_positions", model.at("seq_len")},
      {"n_ctx", model.at("seq_len")},
      {"n_embd", model.at("d_model")},
      {"n_layer", model.at("n_layer")},
      {"n_head", model.at("n_head")},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},  // the tanh approximation
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", true},
      {"torch_dtype", torch_dtype},
  };
  if (arch == ModelArch::kLlama) {
    // Qwen2 is LLaMA with Q/K/V biases only; LLaMA's attention_bias biases Q, K, V and O, its
    // mlp_bias the MLP. Qwen3 is LLaMA with q_norm and k_norm (qk_norm) and attention_bias. A
    // sliding window is Mistral's (no biases; [Note: sliding windows], layers/decoder_config.h),
    // or Qwen2's and Qwen3's use_sliding_window.
    const bool qkv = model.value("qkv_bias", false), o = model.value("o_proj_bias", false),
               mlp = model.value("mlp_bias", false), qwen3 = model.value("qk_norm", false);
    const int window = model.value("sliding_window", 0);
    if (qwen3 && (qkv != o || mlp)) {
      return absl::InvalidArgumentError(
          StrCat("export: model.qk_norm with model.qkv_bias = ", qkv, ", model.o_proj_bias = ", o,
                 ", model.mlp_bias = ", mlp,
                 ": Qwen3, the architecture with q_norm and k_norm, biases Q, K, V and O together "
                 "(attention_bias) and its MLP not at all"));
    }
    const bool qwen2 = !qwen3 && qkv && !o && !mlp;
    if (!qwen2 && qkv != o) {
      return absl::InvalidArgumentError(StrCat(
          "export: model.qkv_bias = ", qkv, " with model.o_proj_bias = ", o,
          (mlp ? " and model.mlp_bias" : ""),
          ": no Hugging Face architecture has these biases (LLaMA's attention_bias sets both, "
          "Qwen2 has Q/K/V biases alone)"));
    }
    if (!qwen2 && !qwen3 && window > 0 && (qkv || mlp)) {
      return absl::InvalidArgumentError(
          "export: model.sliding_window with LLaMA's biases: Mistral, the architecture with a "
          "window, has no biases");
    }
    const char* type = qwen3 ? "qwen3" : qwen2 ? "qwen2" : window > 0 ? "mistral" : "llama";
    config = {
        {"architectures",
         {qwen3        ? "Qwen3ForCausalLM"
          : qwen2      ? "Qwen2ForCausalLM"
          : window > 0 ? "MistralForCausalLM"
                       : "LlamaForCausalLM"}},
        {"model_type", type},
        {"vocab_size", model.at("vocab_size")},
        {"max_position_embeddings", model.at("seq_len")},
        {"hidden_size", model.at("d_model")},
        {"intermediate_size", model.at("intermediate_size")},
        {"num_hidden_layers", model.at("n_layer")},
        {"num_attention_heads", model.at("n_head")},
        {"num_key_value_heads",
         model.value("n_kv_head", 0) > 0 ? model.at("n_kv_head") : model.at("n_head")},
        {"hidden_act", "silu"},
        {"rms_norm_eps", model.at("rms_norm_eps")},
        {"rope_theta", model.at("rope_theta")},
        {"tie_word_embeddings", model.value("tie_word_embeddings", false)},
        {"attention_bias", qkv},
        {"initializer_range", 0.02},
        {"torch_dtype", torch_dtype},
    };
    if (mlp) config["mlp_bias"] = true;
    // A head width other than hidden_size / num_attention_heads (LLaMA, Mistral and Qwen2 read it);
    // always for Qwen3, whose absent head_dim is 128.
    if (model.value("head_dim", 0) > 0) {
      config["head_dim"] = model.at("head_dim");
    } else if (qwen3) {
      config["head_dim"] = model.at("d_model").get<int>() / model.at("n_head").get<int>();
    }
    if (window > 0) {
      config["sliding_window"] = window;
      if (qwen2 || qwen3) config["use_sliding_window"] = true;
    }
    // [Note: rotary scaling]: the run config's rope_scaling has Hugging Face's keys.
    const nlohmann::json scaling = model.value("rope_scaling", nlohmann::json());
    if (scaling.is_object() && scaling.value("rope_type", std::string("default")) != "default") {
      config["rope_scaling"] = scaling;
      // Dynamic NTK scales from max_position_embeddings, which transformers reads as the
      // original context: the model's own, not the seq_len it ran at (a longer one is where the
      // scaling starts).
      if (scaling.value("rope_type", std::string()) == "dynamic" &&
          scaling.contains("original_max_position_embeddings")) {
        config["max_position_embeddings"] = scaling.at("original_max_position_embeddings");
      }
    }
  }
  return config;
}

}  // namespace

StatusOr<ExportSummary> ExportHuggingFace(const std::string& step_dir, const std::string& out_dir,
                                          DType dtype, int64_t max_shard_bytes) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        StrCat("export: dtype ", DTypeName(dtype), " (expected f32, bf16 or f16)"));
  }
  const int64_t elem = dtype == DType::kF32 ? 4 : 2;
  if (max_shard_bytes < 1) {
    return absl::InvalidArgumentError(StrCat("export: max shard size ", max_shard_bytes));
  }
  ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  if (SavedByEmbedder(reader.metadata())) {
    return absl::InvalidArgumentError(
        StrCat("export: ", step_dir,
               " was saved by a trainer that embeds zerort (no model config): only zerort "
               "train's GPT checkpoints export to Hugging Face"));
  }
  // The tensors must be the ones config.json will declare.
  ZR_RETURN_IF_ERROR(CheckSavedParams(reader.metadata(), reader.params(), step_dir));
  // The model section as the parser reads it (types checked, a key the checkpoint predates at its
  // default), not as the file has it: a key missing from the file aborted the export.
  ZR_ASSIGN_OR_RETURN(const RunConfig parsed,
                      ParseRunConfig(reader.metadata().at("config"), step_dir + "/metadata.json"));
  const nlohmann::json model = parsed.ToJson().at("model");
  const ModelArch arch =
      model.value("arch", std::string("gpt2")) == "llama" ? ModelArch::kLlama : ModelArch::kGpt2;
  ZR_ASSIGN_OR_RETURN(nlohmann::json config, HuggingFaceConfigOf(model, arch, dtype));
  // The entries first: names and shapes are known from the metadata alone; then the shards,
  // each filled up to max_shard_bytes (one tensor per shard at least).
  std::vector<ShardEntry> entries;
  int64_t total = 0;
  for (const auto& [name, shape] : reader.params()) {
    ZR_ASSIGN_OR_RETURN(HfName hf, ToHuggingFace(name, arch));
    Shape written = shape;
    if (hf.transpose) std::swap(written[0], written[1]);
    entries.push_back({name, hf, written, NumElements(shape) * elem});
    total += entries.back().bytes;
  }
  std::vector<std::vector<ShardEntry>> shards(1);
  int64_t in_shard = 0;
  for (ShardEntry& e : entries) {
    if (in_shard > 0 && in_shard + e.bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += e.bytes;
    shards.back().push_back(std::move(e));
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InvalidArgumentError(StrCat("create ", out_dir, ": ", ec.message()));
  const size_t n = shards.size();
  auto file_of = [n](size_t i) {
    return n == 1 ? std::string("model.safetensors")
                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
  };
  ExportSummary summary;
  std::vector<std::string> written;  // removed again if a later shard fails
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < n; ++i) {
    const std::string path = out_dir + "/" + file_of(i);
    const Status s = WriteShard(path, shards[i], reader, dtype, summary);
    if (!s.ok()) {
      for (const std::string& f : written) ::unlink(f.c_str());
      return s;
    }
    written.push_back(path);
    for (const ShardEntry& e : shards[i]) weight_map[e.hf.name] = file_of(i);
  }
  if (n > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    ZR_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/model.safetensors.index.json",
                                           index.dump(2) + "\n", "checkpoint export"));
  }
  summary.files = static_cast<int>(n);

  // An imported model's own config.json, kept through training (RunState::hf_config): its keys
  // survive the export (bos and eos ids, max_position_embeddings, rope_scaling, the
  // architecture's name, ...); only what zerort's checkpoint decides is written over them.
  const nlohmann::json saved = reader.metadata().value("hf_config", nlohmann::json());
  if (saved.is_object()) config = MergeImportedConfig(saved, config);
  ZR_RETURN_IF_ERROR(
      WriteFileAtomically(out_dir + "/config.json", config.dump(2) + "\n", "checkpoint export"));
  // An export into a directory that held an earlier one (the CLI's --overwrite: [Note: outputs
  // the user named] in runtime/user_file.h) leaves none of that one's weights beside its own:
  // transformers reads model.safetensors before an index, so an old single file would shadow new
  // shards, and old shards of another count would lie about the model. Only weight files go.
  std::set<std::string> mine;
  for (size_t i = 0; i < n; ++i) mine.insert(file_of(i));
  if (n > 1) mine.insert("model.safetensors.index.json");
  // model.safetensors, its index, or model-NNNNN-of-NNNNN.safetensors (file_of's names).
  auto weights = [](const std::string& name) {
    if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
    const std::string_view shape = "model-00000-of-00000.safetensors";
    if (name.size() != shape.size()) return false;
    for (size_t i = 0; i < name.size(); ++i) {
      const bool digit = shape[i] == '0';
      if (digit ? !std::isdigit(static_cast<unsigned char>(name[i])) : name[i] != shape[i]) {
        return false;
      }
    }
    return true;
  };
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!mine.contains(name) && weights(name) && !fs::is_directory(e.symlink_status(ec))) {
      stale.push_back(e.path());
    }
  }
  if (ec) return absl::InternalError(StrCat("list ", out_dir, ": ", ec.message()));
  for (const fs::path& p : stale) {
    if (!fs::remove(p, ec) || ec) {
      return absl::InternalError(StrCat("checkpoint export: remove the earlier export's ",
                                        p.string(), ": ", ec.message()));
    }
  }
  return summary;
}

StatusOr<EvalResult> EvaluateCheckpoint(const RunConfig& config, const std::string& step_dir,
                                        const std::string& data_path, int64_t max_windows) {
  // One process, stage 0, on the CPU: the checkpoint's logical layout loads at any world size.
  const DecoderConfig& shape = config.model.shape;
  {  // the run config's architecture must be the checkpoint's (a tie flag, a rotary base, ...)
    ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
    ZR_RETURN_IF_ERROR(CheckSameArchitecture(reader.metadata().value("config", nlohmann::json()),
                                             config.ToJson(), step_dir, "eval"));
  }
  const int micro = 8;
  DataConfig data = config.data;
  data.path = data_path;
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(data, shape.vocab_size));
  const int64_t available = tokens->size() / (shape.seq_len + 1);
  const int64_t windows = max_windows > 0 ? std::min(max_windows, available) : available;
  if (windows == 0) {
    return absl::InvalidArgumentError(
        StrCat(tokens->name(), " holds no window of seq_len + 1 = ", shape.seq_len + 1, " tokens"));
  }
  // data.eod_mask_loss: the targets after the end-of-text token are not counted, as in training.
  ZR_ASSIGN_OR_RETURN(const int32_t eos, EodMaskToken(config.data, shape.vocab_size));
  ZR_ASSIGN_OR_RETURN(auto one, MakeOneProcessModel(shape, micro));
  ZR_RETURN_IF_ERROR(one->manager->Initialize(DecoderInitializer(shape)));
  ZR_RETURN_IF_ERROR(LoadCheckpoint(step_dir, *one->manager, one->groups()).status());
  const int seq = shape.seq_len;
  double sum = 0;
  int64_t tokens_counted = 0;
  std::vector<int32_t> in, target;
  for (int64_t first = 0; first < windows; first += micro) {
    const int count = static_cast<int>(std::min<int64_t>(micro, windows - first));
    in.resize(static_cast<size_t>(count) * seq);
    target.resize(in.size());
    for (int b = 0; b < count; ++b) {
      const int64_t start = (first + b) * (seq + 1);
      const std::span<int32_t> i = std::span(in).subspan(b * seq, seq);
      ZR_RETURN_IF_ERROR(tokens->Read(start, i, shape.vocab_size));
      ZR_RETURN_IF_ERROR(
          tokens->Read(start + 1, std::span(target).subspan(b * seq, seq), shape.vocab_size));
      for (int t = 0; eos >= 0 && t < seq; ++t) {
        if (i[t] == eos) target[b * seq + t] = kIgnoreTarget;
      }
    }
    ZR_ASSIGN_OR_RETURN(double loss, one->model->Loss(in, target, count, seq));
    // The micro-batch's mean is over its counted targets: weighted by them.
    const int64_t counted =
        std::count_if(target.begin(), target.end(), [](int32_t t) { return t != kIgnoreTarget; });
    sum += loss * static_cast<double>(counted);
    tokens_counted += counted;
  }
  return EvalResult{.loss = tokens_counted > 0 ? sum / static_cast<double>(tokens_counted) : 0.0,
                    .tokens = tokens_counted,
                    .windows = windows};
}

StatusOr<ImportSummary> ImportHuggingFace(const std::string& hf_dir, const std::string& out_dir) {
  ZR_ASSIGN_OR_RETURN(const DecoderConfig shape, ReadHuggingFaceConfig(hf_dir));
  RunConfig config;
  config.model.shape = shape;
  config.model.init_from = hf_dir;
  config.optimizer.type = "SGD";  // master weights only (no moments to import)
  config.checkpoint.dir = out_dir;
  // The model is config.json's own: no comparison to make (InitialWeights' for a run's config).
  ZR_ASSIGN_OR_RETURN(std::shared_ptr<const HfWeights> weights, HfWeights::Open(hf_dir, shape));
  const Initializer init = HfWeights::AsInitializer(weights);
  // One process at stage 0 on the CPU, as EvaluateCheckpoint: the checkpoint's logical layout
  // loads at any world size and layout.
  ZR_ASSIGN_OR_RETURN(auto one, MakeOneProcessModel(shape, 1));
  ZR_RETURN_IF_ERROR(one->manager->Initialize(init));
  ZR_RETURN_IF_ERROR(weights->NonFinite());  // [Note: weights that are not numbers]
  ZR_ASSIGN_OR_RETURN(nlohmann::json hf_config, ReadHuggingFaceConfigJson(hf_dir));
  const RunState state{.step = 0,
                       .config = config.ToJson(),
                       .hf_config = std::move(hf_config),
                       .run_id = NewRunId()};
  CheckpointGroups groups = one->groups();
  groups.unit_positions = one->model->UnitPositions();
  ZR_RETURN_IF_ERROR(SaveCheckpoint(out_dir, state, *one->manager, groups, /*keep_last_n=*/1));
  return ImportSummary{.step_dir = out_dir + "/step_0", .parameters = shape.NumParameters()};
}

}  // namespace zerort
