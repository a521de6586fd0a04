// Hugging Face weights from safetensors files (safetensors.h).
#include "zerort/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <tuple>

#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/hf_names.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

constexpr int64_t kMaxHeader = int64_t{100} << 20;  // safetensors' own limit

Status Bad(const std::string& file, const std::string& what) {
  return absl::InvalidArgumentError(StrCat(file, ": ", what));
}

// The dtype of a tensor zerort can read, or nullopt.
std::optional<DType> ReadableDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  return std::nullopt;
}

// Bits an element of a safetensors dtype takes (safetensors' own list, fp4/fp6 packed), or 0
// for a name it does not list (a newer format's): such a tensor's range is checked, not its size.
int DTypeBits(const std::string& name) {
  static const std::map<std::string, int, std::less<>> kBits = {
      {"F64", 64}, {"I64", 64},    {"U64", 64},    {"C64", 64},    {"F32", 32},
      {"I32", 32}, {"U32", 32},    {"F16", 16},    {"BF16", 16},   {"I16", 16},
      {"U16", 16}, {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"I8", 8},
      {"U8", 8},   {"BOOL", 8},    {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"F4", 4}};
  const auto it = kBits.find(name);
  return it == kBits.end() ? 0 : it->second;
}

float ValueAt(const SafeTensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      return Bf16BitsToFloat(bits);
    }
    case DType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      return F16BitsToFloat(bits);
    }
    default: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
  }
}

// Elements [first, first + n) of `t` as floats.
void LoadAsFloatRange(const SafeTensor& t, int64_t first, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::kBF16:
    case DType::kF16: {
      const bool bf16 = t.dtype == DType::kBF16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, t.data + 2 * (first + i), 2);
        out[i] = bf16 ? Bf16BitsToFloat(bits) : F16BitsToFloat(bits);
      }
      return;
    }
    default:
      std::memcpy(out, t.data + 4 * first, static_cast<size_t>(n) * 4);
  }
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return ErrnoError(StrCat("open ", path), err);
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    return ErrnoError(StrCat("stat ", path), err);
  }
  if (!S_ISREG(st.st_mode)) return Bad(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) return Bad(path, StrCat("a safetensors file starts with 8 bytes; it holds ", size));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    return ErrnoError(StrCat("mmap ", path), err);
  }
  f->map_ = map;
  f->size_ = size;
  const auto* base = static_cast<const std::byte*>(map);
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (header > static_cast<uint64_t>(kMaxHeader) || header > size - 8) {
    return Bad(path, StrCat("header of ", header, " bytes in a file of ", size,
                            " (at most 100 MiB, and inside the file)"));
  }
  JsonLimits limits;
  limits.max_depth = 8;
  limits.max_bytes = kMaxHeader;
  ZR_ASSIGN_OR_RETURN(
      const nlohmann::json j,
      ParseJsonText(std::string_view(reinterpret_cast<const char*>(base + 8), header), path,
                    limits));
  const uint64_t data_size = size - 8 - header;
  const std::byte* data = base + 8 + header;
  struct Range {
    uint64_t begin, end;
    std::string name;
    bool operator<(const Range& o) const {
      return std::tie(begin, end, name) < std::tie(o.begin, o.end, o.name);
    }
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string where = StrCat("tensor '", name, "'");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.at("dtype").is_string() ||
        !entry.contains("shape") || !entry.at("shape").is_array() ||
        !entry.contains("data_offsets") || !entry.at("data_offsets").is_array() ||
        entry.at("data_offsets").size() != 2) {
      return Bad(path, StrCat(where,
                              ": needs dtype (string), shape (list) and data_offsets "
                              "(two integers)"));
    }
    SafeTensor t;
    t.dtype_name = entry.at("dtype").get<std::string>();
    const std::optional<DType> dtype = ReadableDType(t.dtype_name);
    // Other dtypes (an integer buffer, an fp8 or fp4 tensor) may sit in the file; they are
    // refused if a model needs them. Their size is still checked where the dtype is known.
    const int bits = DTypeBits(t.dtype_name);
    if (dtype) t.dtype = *dtype;
    uint64_t numel = 1;
    for (const nlohmann::json& d : entry.at("shape")) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return Bad(path, StrCat(where, ": shape ", ShortDump(entry.at("shape")),
                                " (each size a non-negative integer up to 2^40)"));
      }
      const uint64_t n = d.get<uint64_t>();
      if (n != 0 && numel > (uint64_t{1} << 50) / n) {
        return Bad(path, StrCat(where, ": shape ", ShortDump(entry.at("shape")), " is too large"));
      }
      numel *= n;
      t.shape.push_back(static_cast<int64_t>(n));
    }
    const nlohmann::json& off = entry.at("data_offsets");
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Bad(path, StrCat(where, ": data_offsets ", ShortDump(off), " are not integers"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    const uint64_t want = (numel * static_cast<uint64_t>(bits) + 7) / 8;  // sub-byte: packed
    if (begin > end || end > data_size || (bits > 0 && end - begin != want)) {
      return Bad(path, StrCat(where, ": data_offsets [", begin, ", ", end, ") for ", numel,
                              " elements of ", t.dtype_name, " in ", data_size, " bytes of data"));
    }
    t.data = data + begin;
    t.bytes = static_cast<int64_t>(end - begin);
    f->tensors_.emplace(name, std::move(t));
    ranges.push_back({begin, end, name});
  }
  // No two tensors share bytes: a file whose offsets overlap would hand one tensor's values to
  // another (safetensors' own loader refuses it too).
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    if (b.begin < a.end && b.begin != b.end && a.begin != a.end) {
      return Bad(path, StrCat("tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name,
                              "' [", b.begin, ", ", b.end, ") overlap in its data_offsets"));
    }
  }
  return f;
}

const SafeTensor* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

StatusOr<std::shared_ptr<const HfWeights>> HfWeights::Open(const std::string& dir,
                                                           const DecoderConfig& config) {
  namespace fs = std::filesystem;
  auto w = std::shared_ptr<HfWeights>(new HfWeights());
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(StrCat(dir,
                                             ": not a directory (a Hugging Face model "
                                             "directory: config.json and *.safetensors)"));
  }
  const fs::path root(dir);
  const fs::path index = root / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index, ec)) {
    JsonLimits limits;
    limits.max_bytes = int64_t{16} << 20;
    ZR_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJsonFile(index.string(), limits));
    if (!j.contains("weight_map") || !j.at("weight_map").is_object()) {
      return Bad(index.string(), "no weight_map object");
    }
    std::map<std::string, int> opened;
    for (const auto& [tensor, file] : j.at("weight_map").items()) {
      if (!file.is_string())
        return Bad(index.string(), StrCat("weight_map.", tensor, " is not a file name"));
      const std::string name = file.get<std::string>();
      // A plain file name in the directory: nothing outside the named directory is read.
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
          !name.ends_with(".safetensors")) {
        return Bad(index.string(), StrCat("weight_map.", tensor, " = \"", name,
                                          "\": not a .safetensors file name in the directory"));
      }
      if (!opened.contains(name)) {
        opened[name] = 0;
        names.push_back(name);
      }
    }
  } else if (fs::exists(root / "model.safetensors", ec)) {
    names.push_back("model.safetensors");
  } else {
    return absl::InvalidArgumentError(
        StrCat(dir,
               ": holds neither model.safetensors nor model.safetensors.index.json (zerort reads "
               "safetensors weights, not PyTorch .bin files)"));
  }
  for (const std::string& name : names) {
    const fs::path p = root / name;
    if (fs::is_symlink(p, ec)) {
      return Bad(p.string(), "a symbolic link: zerort reads the files in the directory itself");
    }
    ZR_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(p.string()));
    w->files_.push_back(std::move(f));
  }
  // A tensor in two shards: which one a loader takes would be its file order's accident.
  std::map<std::string, std::string> home;
  for (const auto& f : w->files_) {
    for (const auto& [name, tensor] : f->tensors()) {
      const auto [it, fresh] = home.emplace(name, f->path());
      if (!fresh) {
        return Bad(f->path(), StrCat("tensor '", name, "' is also in ", it->second,
                                     ": a tensor belongs to one shard"));
      }
    }
  }
  // Every tensor the model needs: found, readable and of the right shape, before any allocation.
  ZR_ASSIGN_OR_RETURN(const std::vector<DecoderUnit> units, DecoderUnits(config, 1, 0));
  const std::string base = HfBasePrefix(config.arch);
  for (const DecoderUnit& u : units) {
    for (const ParamSpec& p : u.params) {
      ZR_ASSIGN_OR_RETURN(const HfName hf, ToHuggingFace(p.name, config.arch));
      const SafeTensor* t = nullptr;
      const SafetensorsFile* in = nullptr;
      // The base model's files leave out its prefix (GPT-2's own "h.0.attn.c_attn.weight").
      const std::string bare = hf.name.starts_with(base) ? hf.name.substr(base.size()) : hf.name;
      for (const auto& f : w->files_) {
        if ((t = f->Find(hf.name)) != nullptr || (t = f->Find(bare)) != nullptr) {
          in = f.get();
          break;
        }
      }
      if (t == nullptr) {
        return absl::InvalidArgumentError(
            StrCat(dir, ": no tensor '", hf.name, "' (zerort's ", p.name, ") in ", w->files_.size(),
                   " safetensors file(s); is config.json this model's?"));
      }
      Shape want = p.real_shape();
      if (hf.transpose) std::swap(want[0], want[1]);
      if (!ReadableDType(t->dtype_name)) {
        return Bad(in->path(), StrCat("tensor '", hf.name, "' is ", t->dtype_name,
                                      " (zerort reads F32, BF16 and F16)"));
      }
      if (t->shape != std::vector<int64_t>(want.begin(), want.end())) {
        return Bad(in->path(), StrCat("tensor '", hf.name, "' has shape ", ShortDump(t->shape),
                                      "; config.json's model needs ", ShortDump(want)));
      }
      w->sources_[p.name] =
          Source{.tensor = t, .transpose = hf.transpose, .hf_name = hf.name, .file = &in->path()};
      w->parameters_ += p.real_numel();
    }
  }
  return std::shared_ptr<const HfWeights>(std::move(w));
}

void HfWeights::Fill(const ParamSpec& spec, std::span<float> local) const {
  const auto it = sources_.find(spec.name);
  ZR_CHECK(it != sources_.end()) << "HfWeights was opened for another model: no " << spec.name;
  const Source& s = it->second;
  const Shape real = spec.real_shape();
  std::fill(local.begin(), local.end(), 0.0f);  // padding rows stay 0
  for (const GlobalRun& run : RealGlobalRuns(spec, 0, spec.numel())) {
    float* out = local.data() + run.local;
    // ours [out, in] at (o, c) is HF's (GPT-2's Conv1D) [in, out] at (c, o)
    auto file_index = [&](int64_t g) {
      return s.transpose ? g % real[1] * real[0] + g / real[1] : g;
    };
    if (!s.transpose) {  // a contiguous run of the file: widened in one typed loop
      LoadAsFloatRange(*s.tensor, run.global, run.length, out);
    } else {
      for (int64_t i = 0; i < run.length; ++i)
        out[i] = ValueAt(*s.tensor, file_index(run.global + i));
    }
    const float* bad =
        std::find_if(out, out + run.length, [](float v) { return !std::isfinite(v); });
    if (bad != out + run.length) NoteNonFinite(s, file_index(run.global + (bad - out)), *bad);
  }
}

void HfWeights::NoteNonFinite(const Source& s, int64_t element, float value) const {
  const std::lock_guard<std::mutex> lock(mu_);
  if (!non_finite_.empty()) return;  // the first one found is the one named
  non_finite_ = StrCat(*s.file, ": tensor '", s.hf_name, "' holds ", value, " at element ", element,
                       " (every weight must be a finite number)");
}

Status HfWeights::NonFinite() const {
  const std::lock_guard<std::mutex> lock(mu_);
  if (non_finite_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(non_finite_);
}

Initializer HfWeights::AsInitializer(std::shared_ptr<const HfWeights> weights) {
  return [weights](const ParamSpec& spec, uint64_t, std::span<float> full) {
    weights->Fill(spec, full);
  };
}

namespace {

Status NamedInitFrom(const Status& s) {
  return absl::Status(s.code(), StrCat("model.init_from: ", s.message()));
}

// model.init_from's weights, checked against the run's model (InitialWeights).
StatusOr<std::shared_ptr<const HfWeights>> OpenInitFrom(const ModelConfig& model) {
  const std::string& dir = model.init_from;
  StatusOr<DecoderConfig> hf = ReadHuggingFaceConfig(dir);
  if (!hf.ok()) return NamedInitFrom(hf.status());
  DecoderConfig want = model.shape;
  if (want.llama() && want.seq_len <= hf->seq_len) want.seq_len = hf->seq_len;
  if (!(want == *hf)) {
    const DecoderConfig& h = *hf;
    const DecoderConfig& m = model.shape;
    std::string diff;
    auto note = [&](const char* key, const auto& ours, const auto& theirs) {
      if (ours != theirs) diff += StrCat(diff.empty() ? "" : ", ", key, " ", ours, " vs ", theirs);
    };
    note("model.arch", std::string(ModelArchName(m.arch)), std::string(ModelArchName(h.arch)));
    note("n_layer", m.n_layer, h.n_layer);
    note("n_head", m.n_head, h.n_head);
    note("n_kv_head", m.kv_heads(), h.kv_heads());
    note("head_dim", m.head_size(), h.head_size());
    note("d_model", m.d_model, h.d_model);
    note("intermediate_size", m.intermediate_size, h.intermediate_size);
    note("vocab_size", m.vocab_size, h.vocab_size);
    note("seq_len", want.seq_len, h.seq_len);  // a shorter context is allowed
    note("rope_theta", m.rope_theta, h.rope_theta);
    note("rms_norm_eps", m.norm_eps, h.norm_eps);
    note("tie_word_embeddings", m.tie_word_embeddings, h.tie_word_embeddings);
    note("qkv_bias", m.qkv_bias, h.qkv_bias);
    note("o_proj_bias", m.o_proj_bias, h.o_proj_bias);
    note("mlp_bias", m.mlp_bias, h.mlp_bias);
    note("qk_norm", m.qk_norm, h.qk_norm);
    note("rope_scaling", RopeScalingText(m.rope_scaling), RopeScalingText(h.rope_scaling));
    note("sliding_window", m.sliding_window, h.sliding_window);
    return absl::InvalidArgumentError(
        StrCat("model.init_from: ", dir, "/config.json is another model than the config's (", diff,
               "; the config's first): set the model keys to the checkpoint's"));
  }
  StatusOr<std::shared_ptr<const HfWeights>> weights = HfWeights::Open(dir, model.shape);
  if (!weights.ok()) return NamedInitFrom(weights.status());
  return weights;
}

}  // namespace

StatusOr<Initializer> InitialWeights(const ModelConfig& model) {
  if (model.init_from.empty()) return DecoderInitializer(model.shape);
  ZR_ASSIGN_OR_RETURN(std::shared_ptr<const HfWeights> weights, OpenInitFrom(model));
  return HfWeights::AsInitializer(std::move(weights));
}

Status InitializeWeights(const ModelConfig& model, ShardManager& manager) {
  if (model.init_from.empty()) return manager.Initialize(DecoderInitializer(model.shape));
  ZR_ASSIGN_OR_RETURN(std::shared_ptr<const HfWeights> weights, OpenInitFrom(model));
  ZR_RETURN_IF_ERROR(manager.Initialize(HfWeights::AsInitializer(weights)));
  const Status finite = weights->NonFinite();
  return finite.ok() ? finite : NamedInitFrom(finite);
}

}  // namespace zerort
