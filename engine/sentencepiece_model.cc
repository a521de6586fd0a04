// The SentencePiece wall (sentencepiece_model.h): the only file that includes its headers.
#include "engine/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace zerort::spm {
namespace {

std::string Error(const sentencepiece::util::Status& s) {
  return s.ok() ? std::string() : std::string(s.error_message());
}

class Sentences final : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

}  // namespace

struct Model::Impl {
  sentencepiece::SentencePieceProcessor p;
};

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

std::string Model::Load(const std::string& serialized, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> m(new Model());
  const std::string error = Error(m->impl_->p.LoadFromSerializedProto(serialized));
  if (error.empty()) *out = std::move(m);
  return error;
}

std::string Model::Encode(std::string_view text, std::vector<int>* ids) const {
  return Error(impl_->p.Encode(text, ids));
}

std::string Model::Decode(const std::vector<int>& ids, std::string* text) const {
  return Error(impl_->p.Decode(ids, text));
}

int Model::size() const { return impl_->p.GetPieceSize(); }
int Model::eos() const { return impl_->p.eos_id(); }
int Model::PieceToId(std::string_view piece) const { return impl_->p.PieceToId(piece); }
bool Model::IsControl(int id) const { return impl_->p.IsControl(id); }
bool Model::IsUnknown(int id) const { return impl_->p.IsUnknown(id); }

std::string Train(const std::vector<std::string>& sentences,
                  const std::unordered_map<std::string, std::string>& options,
                  std::string* serialized) {
  Sentences it(sentences);
  return Error(sentencepiece::SentencePieceTrainer::Train(options, &it, serialized));
}

}  // namespace zerort::spm
