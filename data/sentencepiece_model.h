// SentencePiece behind a wall: Debian's libsentencepiece declares its own absl::string_view,
// which clashes with Abseil's, so its headers are included by sentencepiece_model.cc alone and
// this interface speaks std types only (errors as text; "" is success). Used by
// data/tokenizer.cc ([Note: zerort's tokenizers]) and `zerort data train-tokenizer`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zerort::spm {

class Model {
 public:
  ~Model();
  // A model from a serialized ModelProto (the bytes of a .model file).
  static std::string Load(const std::string& serialized, std::unique_ptr<Model>* out);
  std::string Encode(std::string_view text, std::vector<int>* ids) const;
  std::string Decode(const std::vector<int>& ids, std::string* text) const;
  // Whether a text cut at a single space between two other characters, the space dropped,
  // encodes to the whole text's ids ([Note: cutting a text], tokenizer.h).
  bool CutsAtSpaces() const;
  int size() const;
  int eos() const;  // -1 when the model has none
  int PieceToId(std::string_view piece) const;
  bool IsControl(int id) const;
  bool IsUnknown(int id) const;

 private:
  Model();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Trains a model on `sentences` with SentencePiece's options (vocab_size, model_type, ...);
// the serialized ModelProto goes to `serialized`.
std::string Train(const std::vector<std::string>& sentences,
                  const std::unordered_map<std::string, std::string>& options,
                  std::string* serialized);

}  // namespace zerort::spm
