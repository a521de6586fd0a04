// The SentencePiece wall (sentencepiece_model.h): the only file that includes its headers.
#include "zerort/data/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>

namespace zerort::spm {
namespace {

std::string Error(const sentencepiece::util::Status& s) {
  return s.ok() ? std::string() : std::string(s.error_message());
}

// libsentencepiece answers most damage with a Status but some by throwing: a unigram model with a
// piece that starts with NUL throws from its trie builder (darts-clone: "zero-length key"), which
// ended the process (std::terminate) where a damaged tokenizer.model must be an error naming the
// file (found by the file fuzzers, 2026-12-03: tests/fuzz/). Every call through the wall is
// guarded.
template <typename F>
std::string Guarded(F&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return std::string("the model is damaged (") + e.what() + ")";
  } catch (...) {
    return "the model is damaged (SentencePiece threw)";
  }
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
  bool cuts_at_spaces = false;
};

namespace {

// [Note: cutting a text] (tokenizer.h) for a SentencePiece model: no piece holds the whitespace
// symbol after another character, and the model adds a dummy prefix (probed: a normal
// one-character piece, encoded alone, comes out with a leading whitespace symbol).
bool SpacesCut(const sentencepiece::SentencePieceProcessor& p) {
  const std::string ws = "\xE2\x96\x81";  // U+2581
  std::string probe;
  for (int id = 0; id < p.GetPieceSize(); ++id) {
    const std::string& piece = p.IdToPiece(id);
    size_t lead = 0;
    while (piece.compare(lead, ws.size(), ws) == 0) lead += ws.size();
    if (piece.find(ws, lead) != std::string::npos) return false;
    const bool normal = !p.IsControl(id) && !p.IsUnknown(id) && !p.IsUnused(id) && !p.IsByte(id);
    const auto first = static_cast<unsigned char>(piece.empty() ? 0 : piece[0]);
    const size_t len = first < 0x80 ? 1 : first < 0xE0 ? 2 : first < 0xF0 ? 3 : 4;
    if (probe.empty() && normal && lead == 0 && piece.size() == len && first > 0x20) probe = piece;
  }
  if (probe.empty()) return false;
  std::vector<std::string> pieces;
  if (!p.Encode(probe, &pieces).ok() || pieces.empty()) return false;
  return pieces.front().compare(0, ws.size(), ws) == 0;
}

}  // namespace

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

std::string Model::Load(const std::string& serialized, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> m(new Model());
  return Guarded([&] {
    std::string error = Error(m->impl_->p.LoadFromSerializedProto(serialized));
    if (!error.empty()) return error;
    // A load can succeed and leave a processor of no pieces, every query then logging an error
    // and answering 0 (found by the file fuzzers): its status and its size are checked here.
    if (error = Error(m->impl_->p.status()); !error.empty()) return error;
    if (m->impl_->p.GetPieceSize() <= 0) return std::string("the model has no pieces");
    m->impl_->cuts_at_spaces = SpacesCut(m->impl_->p);
    *out = std::move(m);
    return error;
  });
}

std::string Model::Encode(std::string_view text, std::vector<int>* ids) const {
  return Guarded([&] { return Error(impl_->p.Encode(text, ids)); });
}

std::string Model::Decode(const std::vector<int>& ids, std::string* text) const {
  return Guarded([&] { return Error(impl_->p.Decode(ids, text)); });
}

bool Model::CutsAtSpaces() const { return impl_->cuts_at_spaces; }

int Model::size() const { return impl_->p.GetPieceSize(); }
int Model::eos() const { return impl_->p.eos_id(); }
int Model::PieceToId(std::string_view piece) const { return impl_->p.PieceToId(piece); }
bool Model::IsControl(int id) const { return impl_->p.IsControl(id); }
bool Model::IsUnknown(int id) const { return impl_->p.IsUnknown(id); }

std::string Train(const std::vector<std::string>& sentences,
                  const std::unordered_map<std::string, std::string>& options,
                  std::string* serialized) {
  Sentences it(sentences);
  return Guarded(
      [&] { return Error(sentencepiece::SentencePieceTrainer::Train(options, &it, serialized)); });
}

}  // namespace zerort::spm
