// Reading Hugging Face model weights: safetensors files memory-mapped, and a model directory
// (model.safetensors, or model.safetensors.index.json and its shards) as the source of a run's
// initial weights (model.init_from) or of `zerort checkpoint import`.
//
// Untrusted input: a file's 8-byte header length is checked against the file before the JSON
// header is read (bounded: 100 MiB, the bounded JSON reader), every tensor's dtype, shape and
// data_offsets are checked (the product of the shape overflow-checked, the range inside the
// data, its length the shape's bytes), and the index's file names must be plain names in the
// directory (no path, no "..", no links out of it). HfWeights::Open checks every tensor the
// model needs against the model's config (name, dtype F32/BF16/F16, shape) before anything is
// allocated; what the initializer reads afterwards is known to be there.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerort/config/config.h"
#include "zerort/layers/decoder_config.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/shard_manager.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

struct SafeTensor {
  DType dtype = DType::kF32;  // F32, BF16 or F16; other dtypes are refused when read
  std::string dtype_name;     // as the file says ("F32", "I64", ...)
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapped file
  int64_t bytes = 0;
};

// One .safetensors file, memory-mapped read-only for its lifetime.
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // nullptr when the file holds no tensor of that name.
  const SafeTensor* Find(const std::string& name) const;
  const std::map<std::string, SafeTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, SafeTensor> tensors_;
};

// A Hugging Face model directory's weights for `config` (checkpoint/hf_names.h's names), checked.
class HfWeights {
 public:
  static StatusOr<std::shared_ptr<const HfWeights>> Open(const std::string& dir,
                                                         const DecoderConfig& config);
  // Fills a parameter (this tensor-parallel rank's part; padding rows 0) from the files: the
  // initializer of ShardManager::Initialize. Every parameter it is asked for was checked by Open.
  static Initializer AsInitializer(std::shared_ptr<const HfWeights> weights);
  // [Note: weights that are not numbers]
  // A NaN or infinity in a file's weights would start a run that diverges at its first step (or,
  // in fp16 with loss scaling, skips every step) far from its cause. The values are checked as
  // they are filled (Fill reads them anyway; Open, before any allocation, checks the layout
  // only): after the initializer ran, NonFinite() is InvalidArgument naming the file, the
  // tensor, the element and the value of the first such weight filled, or OK.
  Status NonFinite() const;
  int64_t parameters() const { return parameters_; }
  int files() const { return static_cast<int>(files_.size()); }

 private:
  struct Source {
    const SafeTensor* tensor = nullptr;
    bool transpose = false;
    std::string hf_name;                // the tensor's name in its file
    const std::string* file = nullptr;  // its file's path
  };
  void Fill(const ParamSpec& spec, std::span<float> local) const;
  void NoteNonFinite(const Source& s, int64_t element, float value) const;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Source> sources_;  // by zerort name
  int64_t parameters_ = 0;
  mutable std::mutex mu_;
  mutable std::string non_finite_;  // guarded by mu_: the first non-finite weight's message
};

// A run's initial weights: GPT-2's initialisation (DecoderInitializer), or with model.init_from the
// Hugging Face model directory's weights, after its config.json was checked against the run's
// model (every shape key equal; the context may be shorter than the checkpoint's for the LLaMA
// family, whose positions are rotary) and every tensor by HfWeights::Open. Errors name
// model.init_from. The weights' values are not checked here (an Initializer cannot fail):
// InitializeWeights does that after the fill.
StatusOr<Initializer> InitialWeights(const ModelConfig& model);
// manager.Initialize(InitialWeights(model)), then, with model.init_from, the weights' NonFinite()
// (named model.init_from). Each rank fills its own part, so only the ranks whose part holds a
// NaN see it: the caller agrees on the result among the ranks.
Status InitializeWeights(const ModelConfig& model, ShardManager& manager);

}  // namespace zerort
