// Hugging Face model directories' weights (HfWeights, checkpoint/safetensors.h): the llama_tiny
// golden model's directory, written by the independent PyTorch implementation, read bitwise at
// any tensor-parallel size and in 16-bit files; hostile directories, weights that are not numbers
// and overlapping data offsets refused naming the file and the tensor.
#include "zerort/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/hf_names.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/dtype.h"

namespace zerort {
namespace {

namespace fs = std::filesystem;

const std::string kHfDir = ZR_GOLDEN_DIR "/llama_tiny_hf";

nlohmann::json Golden() {
  std::ifstream in(ZR_GOLDEN_DIR "/llama_tiny.json");
  return nlohmann::json::parse(in);
}

// The llama_tiny golden weights, read from the HF directory (two shards and an index, Hugging
// Face's names): every tensor bitwise PyTorch's, in this rank's part at tp 1 and tp 2 (padding
// rows of the vocabulary 0).
TEST(HfWeightsTest, ShardedDirectoryGivesTheReferenceWeightsAtAnyTensorParallelSize) {
  const StatusOr<DecoderConfig> config = ReadHuggingFaceConfig(kHfDir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->n_kv_head, 2);
  EXPECT_FALSE(config->tied());
  const StatusOr<std::shared_ptr<const HfWeights>> w = HfWeights::Open(kHfDir, *config);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->files(), 2);
  EXPECT_EQ((*w)->parameters(), config->NumParameters());
  const Initializer init = HfWeights::AsInitializer(*w);
  const nlohmann::json golden = Golden();
  for (int tp : {1, 2}) {
    for (int rank = 0; rank < tp; ++rank) {
      const StatusOr<std::vector<DecoderUnit>> units = DecoderUnits(*config, tp, rank);
      ASSERT_TRUE(units.ok()) << units.status();
      int checked = 0;
      for (const DecoderUnit& u : *units) {
        for (const ParamSpec& p : u.params) {
          std::vector<float> local(static_cast<size_t>(p.numel()), -1.0f);
          init(p, 0, local);
          const std::vector<float> want = golden.at("params").at(p.name).get<std::vector<float>>();
          for (int64_t i = 0; i < p.numel(); ++i) {
            const int64_t g = GlobalIndex(p, i);
            const float expect = g < p.real_numel() ? want.at(static_cast<size_t>(g)) : 0.0f;
            ASSERT_EQ(local[i], expect)
                << p.name << " tp " << tp << " rank " << rank << " [" << i << "]";
          }
          ++checked;
        }
      }
      EXPECT_EQ(checked, static_cast<int>(golden.at("params").size()));
    }
  }
}

// BF16 and F16 weights (what Hugging Face checkpoints mostly hold): the golden F32 tensors written
// again in 16 bits, one file; each value read is the 16-bit value widened, exactly.
TEST(HfWeightsTest, SixteenBitFilesAreReadExactly) {
  const DecoderConfig config = *ReadHuggingFaceConfig(kHfDir);
  const nlohmann::json golden = Golden();
  const std::vector<DecoderUnit> units = *DecoderUnits(config, 1, 0);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string dir =
        ::testing::TempDir() + "/hf_weights_16/" + std::string(DTypeName(dtype));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy(kHfDir + "/config.json", dir + "/config.json");
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const DecoderUnit& u : units) {
      for (const ParamSpec& p : u.params) {
        const std::string hf = ToHuggingFace(p.name, config.arch)->name;
        const std::vector<float> v = golden.at("params").at(p.name).get<std::vector<float>>();
        header[hf] = {{"dtype", dtype == DType::kBF16 ? "BF16" : "F16"},
                      {"shape", p.real_shape()},
                      {"data_offsets", {data.size(), data.size() + 2 * v.size()}}};
        for (float x : v) {
          const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16Bits(x) : FloatToF16Bits(x);
          data.push_back(static_cast<char>(bits & 0xff));
          data.push_back(static_cast<char>(bits >> 8));
        }
      }
    }
    std::string text = header.dump();
    while (text.size() % 8 != 0) text.push_back(' ');
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << file << text << data;
    const StatusOr<std::shared_ptr<const HfWeights>> w = HfWeights::Open(dir, config);
    ASSERT_TRUE(w.ok()) << w.status();
    const Initializer init = HfWeights::AsInitializer(*w);
    for (const DecoderUnit& u : units) {
      for (const ParamSpec& p : u.params) {
        std::vector<float> got(static_cast<size_t>(p.numel()));
        init(p, 0, got);
        const std::vector<float> v = golden.at("params").at(p.name).get<std::vector<float>>();
        for (size_t i = 0; i < v.size(); ++i) {
          const float want = dtype == DType::kBF16 ? Bf16BitsToFloat(FloatToBf16Bits(v[i]))
                                                   : F16BitsToFloat(FloatToF16Bits(v[i]));
          ASSERT_EQ(got[i], want) << DTypeName(dtype) << " " << p.name << "[" << i << "]";
        }
      }
    }
  }
}

// A copy of the golden directory to break one thing in.
std::string CopyOfHfDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/hf_weights_test/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kHfDir))
    fs::copy(e.path(), dir + "/" + e.path().filename().string());
  return dir;
}

void Patch(const std::string& file, int64_t at, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const std::string& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

TEST(HfWeightsTest, HostileDirectoriesAreRefusedNamingTheFileAndTensor) {
  const DecoderConfig config = *ReadHuggingFaceConfig(kHfDir);
  const std::string shard1 = "/model-00001-of-00002.safetensors";
  struct Case {
    const char* name;
    std::function<void(const std::string&)> breaks;
    const char* expect;
  };
  const Case cases[] = {
      {"header-size",
       [&](const std::string& d) {
         Patch(d + shard1, 0, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
       },
       "header of"},
      {"header-json", [&](const std::string& d) { Patch(d + shard1, 8, "[[[["); },
       shard1.c_str() + 1},
      {"truncated",
       [&](const std::string& d) { fs::resize_file(d + shard1, fs::file_size(d + shard1) - 4); },
       "data_offsets"},
      {"escape",
       [&](const std::string& d) {
         std::string idx = Slurp(d + "/model.safetensors.index.json");
         const size_t at = idx.find("\"model-00002-of-00002.safetensors\"");
         idx.replace(at, 34, "\"../model-00002-of-00002.safetensors\"");
         Write(d + "/model.safetensors.index.json", idx);
       },
       "not a .safetensors file name in the directory"},
      {"missing-shard",
       [&](const std::string& d) { fs::remove(d + "/model-00002-of-00002.safetensors"); },
       "model-00002-of-00002.safetensors"},
      {"no-weights", [&](const std::string& d) { fs::remove(d + "/model.safetensors.index.json"); },
       "neither model.safetensors nor"},
      {"symlink",
       [&](const std::string& d) {
         fs::remove(d + shard1);
         fs::create_symlink(kHfDir + shard1, d + shard1);
       },
       "symbolic link"},
      {"a tensor in two shards",  // a third shard, a copy of the first, named by the index
       [&](const std::string& d) {
         fs::copy(d + shard1, d + "/model-extra.safetensors");
         nlohmann::json idx = nlohmann::json::parse(Slurp(d + "/model.safetensors.index.json"));
         idx["weight_map"]["extra.tensor"] = "model-extra.safetensors";
         Write(d + "/model.safetensors.index.json", idx.dump());
       },
       "is also in"},
  };
  for (const Case& c : cases) {
    const std::string dir = CopyOfHfDir(c.name);
    c.breaks(dir);
    const StatusOr<std::shared_ptr<const HfWeights>> w = HfWeights::Open(dir, config);
    ASSERT_FALSE(w.ok()) << c.name;
    EXPECT_NE(w.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << w.status();
  }
  // Another shape than config.json's: the tensor and both shapes named.
  DecoderConfig wider = config;
  wider.intermediate_size = 32;
  const StatusOr<std::shared_ptr<const HfWeights>> w = HfWeights::Open(kHfDir, wider);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.0.mlp.gate_proj.weight' has shape [24,16]"),
            std::string::npos)
      << w.status();
  // model.init_from against a config of another model: the differing keys named.
  ModelConfig m;
  m.shape = wider;
  m.init_from = kHfDir;
  const StatusOr<Initializer> init = InitialWeights(m);
  ASSERT_FALSE(init.ok());
  EXPECT_NE(init.status().message().find("intermediate_size 32 vs 24"), std::string::npos)
      << init.status();
  EXPECT_NE(init.status().message().find("model.init_from"), std::string::npos);
  // A shorter context is allowed, so not named when something else differs.
  m.shape.seq_len = 4;
  const StatusOr<Initializer> shorter = InitialWeights(m);
  ASSERT_FALSE(shorter.ok());
  EXPECT_EQ(shorter.status().message().find("seq_len"), std::string::npos) << shorter.status();
  m.shape = config;
  m.shape.seq_len = 4;  // a shorter context than the checkpoint's: rotary positions allow it
  EXPECT_TRUE(InitialWeights(m).ok());
}

// [Note: weights that are not numbers]: a NaN or an infinity in a file is named after the fill
// (file, tensor, element, value), the first one found; a clean directory says nothing.
TEST(HfWeightsTest, WeightsThatAreNotNumbersAreNamed) {
  const DecoderConfig config = *ReadHuggingFaceConfig(kHfDir);
  const std::vector<DecoderUnit> units = *DecoderUnits(config, 1, 0);
  auto fill_all = [&](const std::string& dir) {
    const StatusOr<std::shared_ptr<const HfWeights>> w = HfWeights::Open(dir, config);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return w.status();
    const Initializer init = HfWeights::AsInitializer(*w);
    for (const DecoderUnit& u : units) {
      for (const ParamSpec& p : u.params) {
        std::vector<float> local(static_cast<size_t>(p.numel()));
        init(p, 0, local);
      }
    }
    return (*w)->NonFinite();
  };
  EXPECT_TRUE(fill_all(kHfDir).ok());
  // Element `at` of tensor `name`, wherever the index put it, set to `value`; returns its file.
  auto poison = [&](const std::string& dir, const std::string& name, int64_t at, float value) {
    const nlohmann::json idx = nlohmann::json::parse(Slurp(dir + "/model.safetensors.index.json"));
    const std::string file = dir + "/" + idx.at("weight_map").at(name).get<std::string>();
    const std::string bytes = Slurp(file);
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, header));
    EXPECT_EQ(h.at(name).at("dtype"), "F32");
    const int64_t begin = h.at(name).at("data_offsets").at(0).get<int64_t>();
    std::string v(4, '\0');
    std::memcpy(v.data(), &value, 4);
    Patch(file, 8 + static_cast<int64_t>(header) + begin + 4 * at, v);
    return file;
  };
  const std::string nan_dir = CopyOfHfDir("nan");
  const std::string nan_file = poison(nan_dir, "model.layers.1.mlp.up_proj.weight", 5,
                                      std::numeric_limits<float>::quiet_NaN());
  const Status nan = fill_all(nan_dir);
  EXPECT_TRUE(absl::IsInvalidArgument(nan)) << nan;
  EXPECT_NE(nan.message().find(nan_file + ": tensor 'model.layers.1.mlp.up_proj.weight' holds nan "
                                          "at element 5"),
            std::string::npos)
      << nan;
  const std::string inf_dir = CopyOfHfDir("inf");
  poison(inf_dir, "model.norm.weight", 0, -std::numeric_limits<float>::infinity());
  const Status inf = fill_all(inf_dir);
  EXPECT_NE(inf.message().find("tensor 'model.norm.weight' holds -inf at element 0"),
            std::string::npos)
      << inf;
}

// `dir`/t.safetensors of `header` and 16 zero bytes of data, opened.
StatusOr<std::unique_ptr<SafetensorsFile>> OpenWithHeader(const std::string& dir,
                                                          const nlohmann::json& header) {
  fs::create_directories(dir);
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  const std::string path = dir + "/t.safetensors";
  Write(path, bytes + text + std::string(16, '\0'));
  return SafetensorsFile::Open(path);
}

// Two tensors whose data_offsets overlap would read one's bytes as the other's: refused naming
// both (safetensors' own loader refuses it too); adjacent ones and empty ones are fine.
TEST(HfWeightsTest, OverlappingDataOffsetsAreRefused) {
  auto file = [](const nlohmann::json& header) {
    return OpenWithHeader(::testing::TempDir() + "/hf_weights_overlap", header);
  };
  auto entry = [](int64_t begin, int64_t n) {
    return nlohmann::json{
        {"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {begin, begin + 4 * n}}};
  };
  const auto overlap = file({{"a", entry(0, 2)}, {"b", entry(4, 2)}});
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("tensors 'a' [0, 8) and 'b' [4, 12) overlap"),
            std::string::npos)
      << overlap.status();
  EXPECT_TRUE(file({{"a", entry(0, 2)}, {"b", entry(8, 2)}, {"c", entry(8, 0)}}).ok());
}

// Tensors of dtypes zerort does not read sit beside the weights in real files (an integer
// buffer, fp8 scales, packed fp4 blocks): their sizes are safetensors' (fp4 two to a byte), and
// a name safetensors does not list has its range checked only.
TEST(HfWeightsTest, OtherDtypesAreSizedAsSafetensorsSizesThem) {
  auto file = [](const char* dtype, int64_t n, int64_t bytes) {
    const nlohmann::json header = {
        {"t", {{"dtype", dtype}, {"shape", {n}}, {"data_offsets", {0, bytes}}}}};
    return OpenWithHeader(::testing::TempDir() + "/hf_weights_dtypes", header).status();
  };
  EXPECT_TRUE(file("C64", 2, 16).ok());
  EXPECT_TRUE(file("F8_E4M3", 5, 5).ok());
  EXPECT_TRUE(file("F4", 5, 3).ok());  // 20 bits in 3 bytes
  EXPECT_TRUE(file("F6_E3M2", 4, 3).ok());
  EXPECT_TRUE(file("BOOL", 7, 7).ok());
  EXPECT_TRUE(file("X99", 3, 11).ok());  // not safetensors' name: its range only
  const Status short_f4 = file("F4", 5, 2);
  EXPECT_NE(short_f4.message().find("data_offsets [0, 2) for 5 elements of F4"), std::string::npos)
      << short_f4;
  EXPECT_FALSE(file("C64", 2, 2).ok());   // sized as one byte an element until 2026-12-04
  EXPECT_FALSE(file("X99", 3, 17).ok());  // past the data
}

}  // namespace
}  // namespace zerort
