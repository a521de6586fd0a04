// The file fuzzers' targets and mutator ([Note: the file fuzzers], fuzz_targets.h).
#include "tests/fuzz/fuzz_targets.h"

#include <xxhash.h>
#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/checkpoint/checkpoint_files.h"
#include "zerort/checkpoint/config_match.h"
#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/hf_names.h"
#include "zerort/checkpoint/safetensors.h"
#include "zerort/config/config.h"
#include "zerort/data/token_source.h"
#include "zerort/data/tokenizer.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/user_file.h"

namespace zerort::fuzz {
namespace {

// A committed seed file: a missing or unreadable one stops the driver naming it.
std::string ReadSeed(const std::string& path) {
  StatusOr<std::string> bytes = ReadDataFile(path, int64_t{64} << 20);
  if (!bytes.ok()) {
    std::fprintf(stderr, "fuzz: seed file %s\n", std::string(bytes.status().message()).c_str());
    std::abort();
  }
  return *std::move(bytes);
}

// Not WriteFileAtomically: its fsync and rename per input would be most of a fuzzer's time, and a
// scratch file needs neither.
Status WriteWhole(const std::string& path, std::span<const uint8_t> data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError("fuzz: cannot write " + path);
  return absl::OkStatus();
}

void PutLittle(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A promise broken (a reader that accepted a file and then gave something a run cannot use, a
// tokenizer's ids changed by a cut) is a bug as much as a crash: it aborts (the drivers report the
// input).
void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: a promise is broken: %s\n", what);
    std::abort();
  }
}

// ---- Token files: TokenSource (zerort's, llm.c's and raw arrays) ----
// Byte 0 picks the format asked for (detect, uint16, uint32); the rest is the file.

Status ReadTokens(const TokenSource& s) {
  const int vocab = s.vocab_size() > 0 ? s.vocab_size() : INT_MAX;
  const int64_t n = s.size();
  std::vector<int32_t> out(static_cast<size_t>(std::min<int64_t>(n, 64)));
  for (const int64_t at : {int64_t{0}, n / 2 - static_cast<int64_t>(out.size()) / 2,
                           n - static_cast<int64_t>(out.size())}) {
    ZR_RETURN_IF_ERROR(s.Read(std::max<int64_t>(at, 0), out, vocab));
  }
  return absl::OkStatus();
}

Status RunTokens(std::span<const uint8_t> data, const FuzzPaths& paths) {
  if (data.empty()) return absl::InvalidArgumentError("fuzz: no format byte");
  const std::string path = paths.scratch + "/tokens.bin";
  ZR_RETURN_IF_ERROR(WriteWhole(path, data.subspan(1)));
  static constexpr std::array<TokenFormat, 3> kFormats = {
      TokenFormat::kDetect, TokenFormat::kUint16, TokenFormat::kUint32};
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> s,
                      TokenSource::Open(path, kFormats[data[0] % kFormats.size()]));
  return ReadTokens(*s);
}

std::vector<std::string> TokenSeeds(const std::string&) {
  std::string zerort = std::string(1, '\0') + "ZRTOKENS";  // detect; zerort's header
  PutLittle(zerort, 1, 4);                                 // version
  PutLittle(zerort, 2, 4);                                 // width
  PutLittle(zerort, 5, 8);                                 // count
  PutLittle(zerort, 300, 4);                               // vocabulary
  PutLittle(zerort, 0, 4);
  for (uint64_t t : {1, 299, 0, 7, 256}) PutLittle(zerort, t, 2);

  std::string llmc(1, '\0');  // llm.c's shard: 256 int32, magic, version 1 (uint16), count
  PutLittle(llmc, 20240520, 4);
  PutLittle(llmc, 1, 4);
  PutLittle(llmc, 4, 4);
  llmc.append(253 * 4, '\0');
  for (uint64_t t : {50256, 11, 0, 65535}) PutLittle(llmc, t, 2);

  std::string raw16(1, '\1'), raw32(1, '\2');
  for (uint64_t t : {3, 1, 4, 1, 5, 9}) {
    PutLittle(raw16, t, 2);
    PutLittle(raw32, t * 100000, 4);
  }
  return {zerort, llmc, raw16, raw32};
}

// ---- A Megatron dataset: PREFIX.idx and PREFIX.bin ----
// Bytes 0-1 (little-endian) are the .idx's length; the .idx, then the .bin follow.

Status RunMegatron(std::span<const uint8_t> data, const FuzzPaths& paths) {
  if (data.size() < 2) return absl::InvalidArgumentError("fuzz: no index length");
  const size_t idx = std::min<size_t>(data[0] | (size_t{data[1]} << 8), data.size() - 2);
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/d.idx", data.subspan(2, idx)));
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/d.bin", data.subspan(2 + idx)));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> s,
                      TokenSource::Open(paths.scratch + "/d", TokenFormat::kDetect));
  return ReadTokens(*s);
}

std::string MegatronSeed(int dtype_code, int width, bool multimodal) {
  const std::vector<uint64_t> sizes = {2, 3, 1};
  std::string idx = std::string("MMIDIDX\0\0", 9);
  PutLittle(idx, 1, 8);  // version
  idx.push_back(static_cast<char>(dtype_code));
  PutLittle(idx, sizes.size(), 8);  // sequences
  PutLittle(idx, 2, 8);             // documents
  for (uint64_t s : sizes) PutLittle(idx, s, 4);
  uint64_t pointer = 0;
  for (uint64_t s : sizes) {
    PutLittle(idx, pointer, 8);
    pointer += s * width;
  }
  for (uint64_t d : {0, 3}) PutLittle(idx, d, 8);
  if (multimodal) idx.append(sizes.size(), '\0');
  std::string out;
  PutLittle(out, idx.size(), 2);
  out += idx;
  for (uint64_t t = 0; t < 6; ++t) PutLittle(out, t * 37 + 1, width);
  return out;
}

std::vector<std::string> MegatronSeeds(const std::string&) {
  return {MegatronSeed(8, 2, false), MegatronSeed(4, 4, false), MegatronSeed(5, 8, true),
          MegatronSeed(1, 1, false)};
}

// ---- safetensors ----

Status RunSafetensors(std::span<const uint8_t> data, const FuzzPaths& paths) {
  const std::string path = paths.scratch + "/model.safetensors";
  ZR_RETURN_IF_ERROR(WriteWhole(path, data));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(path));
  unsigned sum = 0;
  for (const auto& [name, t] : f->tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      Require(d >= 0 && (d == 0 || numel <= INT64_MAX / d), "a tensor's shape overflows");
      numel *= d;
    }
    if (t.dtype_name == "F32" || t.dtype_name == "BF16" || t.dtype_name == "F16") {
      Require(t.bytes == numel * static_cast<int64_t>(DTypeSize(t.dtype)),
              "a tensor's bytes disagree with its shape");
    }
    if (t.bytes > 0) {  // inside the mapping: ASan does not see it, a fault does
      sum += static_cast<unsigned>(t.data[0]) + static_cast<unsigned>(t.data[t.bytes - 1]);
    }
  }
  if (sum == 0xFFFFFFFF) return absl::InternalError("unlikely");  // keeps the reads
  return absl::OkStatus();
}

std::string SafetensorsSeed(const std::string& header, size_t data_bytes) {
  std::string out;
  PutLittle(out, header.size(), 8);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 13));
  return out;
}

std::vector<std::string> SafetensorsSeeds(const std::string&) {
  return {SafetensorsSeed(R"({"__metadata__":{"format":"pt"},)"
                          R"("a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                          R"("b.bias":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
                          R"("c":{"dtype":"I64","shape":[1],"data_offsets":[32,40]}})",
                          40),
          SafetensorsSeed(R"({"h":{"dtype":"F16","shape":[2,2,1],"data_offsets":[0,8]},)"
                          R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                          8)};
}

// ---- Hugging Face config.json ----

Status RunHfConfig(std::span<const uint8_t> data, const FuzzPaths& paths) {
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/config.json", data));
  return ReadHuggingFaceConfig(paths.scratch).status();
}

std::vector<std::string> HfConfigSeeds(const std::string&) {
  return {
      R"({"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","vocab_size":50257,
          "n_positions":1024,"n_embd":768,"n_layer":12,"n_head":12,"layer_norm_epsilon":1e-05,
          "activation_function":"gelu_new","tie_word_embeddings":true})",
      R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":128256,
          "hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,
          "num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":131072,
          "rms_norm_eps":1e-05,"rope_theta":500000.0,"hidden_act":"silu",
          "tie_word_embeddings":true,"head_dim":64,"torch_dtype":"bfloat16",
          "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
                          "original_max_position_embeddings":8192,"rope_type":"llama3"}})",
      R"({"architectures":["MistralForCausalLM"],"model_type":"mistral","vocab_size":32000,
          "hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,
          "num_attention_heads":8,"num_key_value_heads":2,"max_position_embeddings":32768,
          "sliding_window":4096,"rms_norm_eps":1e-05,"rope_theta":10000.0,"hidden_act":"silu",
          "tie_word_embeddings":false})",
      R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":151936,
          "hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
          "num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
          "rms_norm_eps":1e-06,"rope_theta":1000000.0,"hidden_act":"silu",
          "tie_word_embeddings":true,"use_sliding_window":false,"sliding_window":32768,
          "rope_scaling":{"factor":4.0,"original_max_position_embeddings":32768,"type":"yarn",
                          "beta_fast":32.0,"attention_factor":null,"mscale":1.0}})",
      R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":151936,
          "hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"head_dim":128,
          "num_attention_heads":16,"num_key_value_heads":8,"max_position_embeddings":40960,
          "rms_norm_eps":1e-06,"rope_theta":1000000,"hidden_act":"silu","attention_bias":false,
          "tie_word_embeddings":true,"use_sliding_window":false,"sliding_window":null,
          "rope_scaling":{"type":"dynamic","factor":2.0}})"};
}

// ---- A Hugging Face model directory's weights (model.init_from, checkpoint import) ----
// Byte 0 picks the model (a tiny GPT-2 or LLaMA, its config.json below); the rest is its
// model.safetensors. HfWeights::Open checks every tensor the model needs; then each parameter is
// filled from the file, as ShardManager::Initialize does.

constexpr std::array<const char*, 2> kHfModels = {
    R"({"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","vocab_size":16,
        "n_positions":8,"n_embd":8,"n_layer":1,"n_head":2,"layer_norm_epsilon":1e-05,
        "activation_function":"gelu_new","tie_word_embeddings":true})",
    R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":16,
        "hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
        "num_key_value_heads":1,"max_position_embeddings":8,"rms_norm_eps":1e-05,
        "rope_theta":10000.0,"hidden_act":"silu","tie_word_embeddings":false})"};

StatusOr<DecoderConfig> HfModel(size_t which) {
  return DecoderConfigFromHuggingFace(nlohmann::json::parse(kHfModels[which]), "config.json");
}

Status RunHfModel(std::span<const uint8_t> data, const FuzzPaths& paths) {
  if (data.empty()) return absl::InvalidArgumentError("fuzz: no model byte");
  ZR_ASSIGN_OR_RETURN(const DecoderConfig config, HfModel(data[0] % kHfModels.size()));
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/model.safetensors", data.subspan(1)));
  ZR_ASSIGN_OR_RETURN(std::shared_ptr<const HfWeights> weights,
                      HfWeights::Open(paths.scratch, config));
  const Initializer fill = HfWeights::AsInitializer(weights);
  ZR_ASSIGN_OR_RETURN(const std::vector<DecoderUnit> units, DecoderUnits(config, 1, 0));
  for (const DecoderUnit& u : units) {
    for (const ParamSpec& p : u.params) {
      std::vector<float> full(static_cast<size_t>(p.numel()));
      fill(p, 0, full);
    }
  }
  return absl::OkStatus();
}

// Each model's tensors as its config names them (F32 for GPT-2, BF16 for LLaMA), values
// (i mod 13) / 7.
std::vector<std::string> HfModelSeeds(const std::string&) {
  std::vector<std::string> out;
  for (size_t which = 0; which < kHfModels.size(); ++which) {
    const DecoderConfig config = *HfModel(which);
    const int width = which == 0 ? 4 : 2;
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    const std::vector<DecoderUnit> units = *DecoderUnits(config, 1, 0);  // not a temporary's
    for (const DecoderUnit& u : units) {
      for (const ParamSpec& p : u.params) {
        const HfName hf = *ToHuggingFace(p.name, config.arch);
        Shape shape = p.real_shape();
        if (hf.transpose) std::swap(shape[0], shape[1]);
        const size_t begin = data.size();
        for (int64_t i = 0; i < p.real_numel(); ++i) {
          const float v = static_cast<float>(i % 13) / 7.0f;
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          PutLittle(data, width == 4 ? bits : bits >> 16, width);
        }
        header[hf.name] = {{"dtype", width == 4 ? "F32" : "BF16"},
                           {"shape", std::vector<int64_t>(shape.begin(), shape.end())},
                           {"data_offsets", {begin, data.size()}}};
      }
    }
    out.push_back(std::string(1, static_cast<char>(which)) + SafetensorsSeed(header.dump(), 0) +
                  data);
  }
  return out;
}

// ---- A checkpoint's metadata.json ----

Status RunMetadata(std::span<const uint8_t> data, const FuzzPaths& paths) {
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/metadata.json", data));
  return ReadMetadata(paths.scratch).status();
}

std::vector<std::string> MetadataSeeds(const std::string& source) {
  return {ReadSeed(source + "/tests/fuzz/seeds/metadata_gpt2.json"),
          ReadSeed(source + "/tests/fuzz/seeds/metadata_llama.json")};
}

// ---- A checkpoint: metadata.json over its shard files ----
// The metadata target stops at metadata.json's validation; this one goes on to what a load does
// with it: every file's size and checksum (VerifyFile), the pieces against the parameters and
// their tiling (CheckpointReader), the saved config's model against the saved parameters
// (InspectCheckpoint), the saved run config against a run's (CheckResumable,
// CheckSameArchitecture). The shard files are made from the input itself: each file a rank entry
// names (a plain name ending in .bin, at most 1 MiB, at most 64 files) gets bytes that depend
// only on its size (ShardBytes), and the seeds, real checkpoints of a GPT-2 at tensor x data 2 x 2
// (ZeRO-3, a vocabulary the group does not divide) and a LLaMA in two pipeline stages, carry
// those bytes' checksums, so a mutant that keeps a file's size passes VerifyFile and reaches the
// pieces. Promises: a parameter read whole has its shape's element count, and a range of it read
// alone is the same bits as that range of the whole.
std::string ShardBytes(int64_t bytes) {
  std::string out(static_cast<size_t>(bytes), '\0');
  for (int64_t i = 0; i + 4 <= bytes; i += 4) {
    const float v = static_cast<float>((i / 4) % 97) * 0.01f - 0.48f;
    std::memcpy(out.data() + i, &v, 4);
  }
  return out;
}

bool PlainShardName(const std::string& name) {
  if (name.size() < 5 || name.size() > 64 || name[0] == '.' || !name.ends_with(".bin")) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_';
  });
}

// Calls `f(file)` for each object under ranks[*].files of a parsed metadata.json.
template <typename F>
void ForEachShardFile(nlohmann::json& metadata, F&& f) {
  if (!metadata.is_object() || !metadata.contains("ranks") || !metadata["ranks"].is_array()) return;
  for (nlohmann::json& rank : metadata["ranks"]) {
    if (!rank.is_object() || !rank.contains("files") || !rank["files"].is_object()) continue;
    for (auto& entry : rank["files"].items()) {
      if (entry.value().is_object()) f(entry.value());
    }
  }
}

Status RunCheckpoint(std::span<const uint8_t> data, const FuzzPaths& paths) {
  ZR_RETURN_IF_ERROR(WriteWhole(paths.scratch + "/metadata.json", data));
  const std::string text(data.begin(), data.end());
  StatusOr<nlohmann::json> parsed = ParseMetadataText(text, "metadata.json");
  if (parsed.ok()) {
    int files = 0;
    Status written = absl::OkStatus();
    ForEachShardFile(*parsed, [&](const nlohmann::json& file) {
      const auto name = file.find("name");
      const auto bytes = file.find("bytes");
      if (name == file.end() || !name->is_string() || bytes == file.end() ||
          !bytes->is_number_integer()) {
        return;
      }
      const int64_t n = bytes->get<int64_t>();
      if (!PlainShardName(*name) || n < 0 || n > (int64_t{1} << 20) || ++files > 64) return;
      const std::string content = ShardBytes(n);
      if (written.ok()) {
        written = WriteWhole(paths.scratch + "/" + name->get<std::string>(),
                             {reinterpret_cast<const uint8_t*>(content.data()), content.size()});
      }
    });
    ZR_RETURN_IF_ERROR(written);
  }
  StatusOr<CheckpointSummary> summary = InspectCheckpoint(paths.scratch);
  ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(paths.scratch));
  // What `train --resume` and `eval` compare (config_match.h): the saved run config, whatever the
  // mutant made of it, against a run's as ToJson writes it: the saved one as it reads (so every
  // key is compared, none differing first), or the defaults where it does not read.
  const nlohmann::json saved = reader.metadata().value("config", nlohmann::json());
  const StatusOr<RunConfig> resumed = ParseRunConfig(saved, "metadata.json");
  const nlohmann::json now = (resumed.ok() ? *resumed : RunConfig()).ToJson();
  (void)CheckResumable(saved, now, paths.scratch);
  (void)CheckSameArchitecture(saved, now, paths.scratch, "eval");
  for (const auto& [name, shape] : reader.params()) {
    int64_t n = 1;
    for (int64_t d : shape) {
      Require(d >= 0 && !__builtin_mul_overflow(n, d, &n),
              "the reader accepted a shape without a finite element count");
    }
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
      if (!reader.HasKind(kind)) continue;
      ZR_ASSIGN_OR_RETURN(const std::vector<float> all, reader.ReadAll(name, kind));
      Require(static_cast<int64_t>(all.size()) == n,
              "a parameter read whole has another element count than its shape's");
      ZR_ASSIGN_OR_RETURN(const std::vector<float> part, reader.Read(name, kind, n / 3, n / 2));
      Require(static_cast<int64_t>(part.size()) == n / 2 - n / 3 &&
                  std::memcmp(part.data(), all.data() + n / 3, part.size() * sizeof(float)) == 0,
              "a range read alone differs from the same range of the whole");
    }
  }
  ZR_RETURN_IF_ERROR(summary.status());
  if (!summary->ok) return absl::DataLossError("inspect: a shard file's size or checksum");
  if (!summary->params.empty()) return absl::DataLossError("inspect: " + summary->params);
  return absl::OkStatus();
}

// Real checkpoints' metadata with each file's checksum made ShardBytes'. The seeds are step 1 of a
// one-step `zerort train` on the CPU with checkpoint.interval 1 (their paths then replaced by
// runs/fuzz/...): a GPT-2 (n_layer 2, n_head 2, d_model 16, seq_len 8, vocab_size 257) on 4
// ranks, parallel.tensor_parallel_size 2, ZeRO-3 with stage3_param_persistence_threshold 0; a
// LLaMA (the same with n_kv_head 1, intermediate_size 32, vocab_size 256) on 2 ranks,
// pipeline_parallel_size 2, ZeRO-1.
std::vector<std::string> CheckpointSeeds(const std::string& source) {
  std::vector<std::string> out;
  for (const char* name : {"checkpoint_gpt2.json", "checkpoint_llama.json"}) {
    nlohmann::json j = nlohmann::json::parse(ReadSeed(source + "/tests/fuzz/seeds/" + name));
    ForEachShardFile(j, [](nlohmann::json& file) {
      const std::string content = ShardBytes(file.at("bytes").get<int64_t>());
      file["xxh3"] = ChecksumHex(XXH3_64bits(content.data(), content.size()));
    });
    out.push_back(j.dump(1));
  }
  return out;
}

// ---- Tokenizers: tokenizer.json and SentencePiece's .model ----

Status UseTokenizer(const Tokenizer& t) {
  const std::string text = "Hello, world!  It's 2026: Grüße, 世界 🙂\n\tend  ";
  std::vector<int32_t> ids;
  ZR_RETURN_IF_ERROR(t.Encode(text, ids));
  ZR_RETURN_IF_ERROR(t.Decode(ids).status());
  const int vocab = t.vocab_size();
  Require(vocab > 0, "a tokenizer without a vocabulary");
  for (int32_t id : ids) Require(id >= 0 && id < vocab, "Encode gave an id outside the vocabulary");
  std::vector<int32_t> all;  // every id of a small vocabulary, the ends of a large one
  for (int32_t id = 0; id < std::min(vocab, 512); ++id) all.push_back(id);
  all.push_back(vocab - 1);
  (void)t.Decode(all);  // a hole in the ids may be refused; it must not crash
  (void)t.AddedToken("<|endoftext|>");
  if (const std::optional<int32_t> eot = t.EndOfText()) {
    Require(*eot >= 0 && *eot < vocab, "the end-of-text token is outside the vocabulary");
  }
  (void)t.LastCut(text, text.size());
  return absl::OkStatus();
}

Status RunTokenizerAt(std::span<const uint8_t> data, const std::string& path) {
  ZR_RETURN_IF_ERROR(WriteWhole(path, data));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> t, Tokenizer::Load(path));
  return UseTokenizer(*t);
}

Status RunTokenizerJson(std::span<const uint8_t> data, const FuzzPaths& paths) {
  return RunTokenizerAt(data, paths.scratch + "/tokenizer.json");
}

Status RunSentencePiece(std::span<const uint8_t> data, const FuzzPaths& paths) {
  return RunTokenizerAt(data, paths.scratch + "/tokenizer.model");
}

std::vector<std::string> TokenizerJsonSeeds(const std::string& source) {
  std::vector<std::string> out;
  for (const char* kind : {"gpt2", "llama2", "llama3", "mistral", "qwen2", "replace"}) {
    out.push_back(ReadSeed(source + "/tests/data/golden/tokenizer_" + kind + ".json"));
  }
  // GPT-2's with an id past the vocab's entry count, leaving holes (the 2026-12-02 overflow: the
  // id table was sized by the count).
  nlohmann::json sparse = nlohmann::json::parse(out.front());
  sparse["model"]["vocab"]["zz"] = sparse["model"]["vocab"].size() + 40;
  out.push_back(sparse.dump());
  return out;
}

std::vector<std::string> SentencePieceSeeds(const std::string& source) {
  return {ReadSeed(source + "/tests/data/golden/sentencepiece_tiny.model")};
}

// ---- Text through the real tokenizers (`data prepare`'s input) ----
// Byte 0 picks one of the golden tokenizers, byte 1 where to look for a cut; the rest is the
// text. What `data prepare` relies on: valid UTF-8 always encodes (invalid is refused by byte),
// every id is in the vocabulary, a byte-level tokenizer without a normalizer gives the text back,
// and a cut LastCut offers encodes, side by side, to the whole text's ids ([Note: cutting a
// text], tokenizer.h: the blocks of a parallel `data prepare`).

constexpr std::array<const char*, 7> kTextTokenizers = {
    "tokenizer_gpt2.json",     "tokenizer_llama3.json", "tokenizer_llama2.json",
    "tokenizer_mistral.json",  "tokenizer_qwen2.json",  "tokenizer_replace.json",
    "sentencepiece_tiny.model"};
constexpr size_t kLosslessTokenizers = 2;  // GPT-2's and LLaMA-3's: byte-level, no normalizer

// The golden tokenizers, loaded at the first input (loading one takes about a millisecond, the
// text a few microseconds): the only state kept between inputs, and never changed by one.
const Tokenizer& TextTokenizer(size_t which, const std::string& source) {
  static std::array<std::unique_ptr<Tokenizer>, kTextTokenizers.size()> loaded;
  if (!loaded[which]) {
    StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::Load(source + "/tests/data/golden/" + kTextTokenizers[which]);
    Require(t.ok(), "a golden tokenizer does not load");
    loaded[which] = *std::move(t);
  }
  return *loaded[which];
}

Status RunText(std::span<const uint8_t> data, const FuzzPaths& paths) {
  if (data.size() < 2) return absl::InvalidArgumentError("fuzz: no tokenizer or cut byte");
  const size_t which = data[0] % kTextTokenizers.size();
  const Tokenizer& t = TextTokenizer(which, paths.source);
  const std::string_view text(reinterpret_cast<const char*>(data.data() + 2), data.size() - 2);
  std::vector<int32_t> ids;
  const Status encoded = t.Encode(text, ids);
  const bool valid = !FirstInvalidUtf8(text).has_value();
  Require(encoded.ok() == valid, "Encode's answer disagrees with the text's UTF-8 validity");
  if (!valid) return encoded;
  for (int32_t id : ids) {
    Require(id >= 0 && id < t.vocab_size(), "Encode gave an id outside the vocabulary");
  }
  ZR_ASSIGN_OR_RETURN(const std::string decoded, t.Decode(ids));
  if (which < kLosslessTokenizers) Require(decoded == text, "Decode(Encode(text)) is not the text");
  const size_t end = text.size() * data[1] / 255;
  if (const std::optional<TextCut> cut = t.LastCut(text, end)) {
    Require(cut->first_end <= cut->second_begin && cut->second_begin <= end,
            "LastCut's place is not before the end asked");
    std::vector<int32_t> sides;
    ZR_RETURN_IF_ERROR(t.Encode(text.substr(0, cut->first_end), sides));
    ZR_RETURN_IF_ERROR(t.Encode(text.substr(cut->second_begin), sides));
    Require(sides == ids, "the two sides of a cut do not encode to the whole text's ids");
  }
  return absl::OkStatus();
}

std::vector<std::string> TextSeeds(const std::string&) {
  const std::vector<std::string> texts = {
      "Hello world. The shard manager gathers\nand frees weights per layer.\n",
      "It's 2026; they'll say: \"Grüße aus Köln\" -- 東京は晴れ 🙂\n\n  indented\tline\n",
      "  leading spaces, trailing   \n\nnumbers 12345 678 and symbols #$%&*()\r\nend",
      "e\xCC\x81 (e + combining acute) vs \xC3\xA9; \xE2\x96\x81 U+2581; <|endoftext|> and "
      "</s> mid-text\nnew line"};
  std::vector<std::string> out;
  for (size_t which = 0; which < kTextTokenizers.size(); ++which) {
    for (size_t i = 0; i < texts.size(); ++i) {
      out.push_back(std::string{static_cast<char>(which), static_cast<char>(60 + 60 * i)} +
                    texts[i]);
    }
  }
  return out;
}

// ---- Run configs (zerort's and DeepSpeed's keys) ----

Status RunConfigFile(std::span<const uint8_t> data, const FuzzPaths& paths) {
  const std::string path = paths.scratch + "/config.json";
  ZR_RETURN_IF_ERROR(WriteWhole(path, data));
  ZR_ASSIGN_OR_RETURN(const RunConfig c, LoadRunConfig(path));
  (void)c.ToJson().dump();
  return absl::OkStatus();
}

std::vector<std::string> JsonFiles(const std::string& folder) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    if (e.path().extension() == ".json") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> out;
  for (const std::string& p : paths) out.push_back(ReadSeed(p));
  return out;
}

std::vector<std::string> RunConfigSeeds(const std::string& source) {
  return JsonFiles(source + "/configs");
}

// Real DeepSpeed configs (tests/configs/deepspeed/SOURCES.md): alone, without a model, some are
// refused (a key zerort does not support), and their keys are worth mutating.
std::vector<std::string> DeepSpeedConfigs(const std::string& source) {
  return JsonFiles(source + "/tests/configs/deepspeed");
}

constexpr std::array<FuzzTarget, 11> kTargets = {{
    {"tokens", RunTokens, TokenSeeds, nullptr, false},
    {"megatron", RunMegatron, MegatronSeeds, nullptr, false},
    {"safetensors", RunSafetensors, SafetensorsSeeds, nullptr, false},
    {"hf_config", RunHfConfig, HfConfigSeeds, nullptr, true},
    {"hf_model", RunHfModel, HfModelSeeds, nullptr, false},
    {"metadata", RunMetadata, MetadataSeeds, nullptr, true},
    {"checkpoint", RunCheckpoint, CheckpointSeeds, nullptr, true},
    {"tokenizer_json", RunTokenizerJson, TokenizerJsonSeeds, nullptr, true},
    {"sentencepiece", RunSentencePiece, SentencePieceSeeds, nullptr, false},
    {"tokenizer_text", RunText, TextSeeds, nullptr, false},
    {"run_config", RunConfigFile, RunConfigSeeds, DeepSpeedConfigs, true},
}};

}  // namespace

std::span<const FuzzTarget> FuzzTargets() { return kTargets; }

const FuzzTarget* FindFuzzTarget(std::string_view name) {
  for (const FuzzTarget& t : FuzzTargets()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace zerort::fuzz
