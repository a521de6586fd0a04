// Tokenizer::Load, the SentencePiece tokenizer and the text codec ([Note: zerort's tokenizers],
// tokenizer.h); tokenizer.json files: hf_tokenizer.cc.
#include "zerort/data/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <thread>

#include "zerort/data/hf_tokenizer.h"
#include "zerort/data/sentencepiece_model.h"
#include "zerort/data/token_file.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace {

// A SentencePiece model (LLaMA-2, Mistral, TinyLlama, Gemma's tokenizer.model), through
// libsentencepiece (sentencepiece_model.h).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<spm::Model> m) : m_(std::move(m)) {}
  Status Encode(std::string_view text, std::vector<int32_t>& out) const override {
    ZR_RETURN_IF_ERROR(RequireUtf8(text));  // SentencePiece would make U+FFFD of it, silently
    std::vector<int> ids;
    if (const std::string e = m_->Encode(text, &ids); !e.empty()) {
      return absl::InvalidArgumentError(StrCat("SentencePiece: ", e));
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return absl::OkStatus();
  }
  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
      }
    }
    std::string text;
    if (const std::string e = m_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
        !e.empty()) {
      return absl::InvalidArgumentError(StrCat("SentencePiece: ", e));
    }
    return text;
  }
  int vocab_size() const override { return m_->size(); }
  std::optional<TextCut> LastCut(std::string_view text, size_t end) const override {
    if (!m_->CutsAtSpaces()) return std::nullopt;
    return LastSpaceCut(text, end, /*drop_space=*/true);  // the dummy prefix puts it back
  }
  std::optional<int32_t> AddedToken(std::string_view content) const override {
    const int id = m_->PieceToId(content);
    if (id < 0 || m_->IsUnknown(id) || !m_->IsControl(id)) return std::nullopt;
    return id;
  }
  std::optional<int32_t> EndOfText() const override {
    return m_->eos() >= 0 ? std::optional<int32_t>(m_->eos()) : std::nullopt;
  }

 private:
  std::unique_ptr<spm::Model> m_;
};

}  // namespace

namespace {
bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
}  // namespace

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                         static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
    if (n <= 0) return at;
    at += static_cast<size_t>(n);
  }
  return std::nullopt;
}

Status RequireUtf8(std::string_view text) {
  if (const std::optional<size_t> at = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(StrCat("the text is not valid UTF-8 at byte ", *at, " (0x",
                                             fmt::format("{:02X}", static_cast<uint8_t>(text[*at])),
                                             "): tokenizers read Unicode text"));
  }
  return absl::OkStatus();
}

std::optional<TextCut> LastLineCut(std::string_view text, size_t end) {
  for (size_t i = std::min(end, text.size()); i > 1; --i) {
    if (text[i - 1] != '\n') continue;
    if (i < text.size() && !IsAsciiSpace(text[i])) return TextCut{i, i};
  }
  return std::nullopt;
}

std::optional<TextCut> LastSpaceCut(std::string_view text, size_t end, bool drop_space) {
  // Three bytes after the space must be there (the text may be a buffer's prefix of more).
  if (text.size() < 5) return std::nullopt;
  for (size_t i = std::min(end, text.size() - 3); i > 1; --i) {
    // Not before a U+2581 of the text's own: a Metaspace prefix would not be added before it.
    // Not after one either: the space becomes another U+2581 beside it, and a token of two
    // (LLaMA-2's vocabulary has one) would span the cut (found by the file fuzzers, tests/fuzz/).
    if (text[i - 1] == ' ' && !IsAsciiSpace(text[i]) && !IsAsciiSpace(text[i - 2]) &&
        (static_cast<uint8_t>(text[i]) & 0xC0) != 0x80 && text.substr(i, 3) != "\xE2\x96\x81" &&
        (i < 4 || text.substr(i - 4, 3) != "\xE2\x96\x81")) {
      return TextCut{i - 1, drop_space ? i : i - 1};
    }
  }
  return std::nullopt;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  if (path.ends_with(".model")) {  // SentencePiece's serialized ModelProto
    ZR_ASSIGN_OR_RETURN(const std::string bytes, ReadDataFile(path, int64_t{256} << 20));
    std::unique_ptr<spm::Model> m;
    if (const std::string e = spm::Model::Load(bytes, &m); !e.empty()) {
      return absl::InvalidArgumentError(StrCat(path, ": not a SentencePiece model (", e, ")"));
    }
    return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(std::move(m)));
  }
  JsonLimits limits;
  limits.max_bytes = int64_t{256} << 20;
  limits.max_depth = 32;
  ZR_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJsonFile(path, limits));
  return HfTokenizerFromJson(j, path);
}

StatusOr<TextCodec> TextCodec::For(const std::string& tokenizer, int vocab_size) {
  TextCodec codec;
  if (tokenizer.empty()) return codec;
  StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(tokenizer);
  if (!t.ok()) return absl::InvalidArgumentError(StrCat("data.tokenizer: ", t.status().message()));
  if ((*t)->vocab_size() > vocab_size) {
    return absl::InvalidArgumentError(StrCat("data.tokenizer: ", tokenizer, " has ",
                                             (*t)->vocab_size(),
                                             " tokens, more than model.vocab_size = ", vocab_size));
  }
  codec.tokenizer_ = *std::move(t);
  return codec;
}

StatusOr<std::vector<int32_t>> TextCodec::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (tokenizer_ == nullptr) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  ZR_RETURN_IF_ERROR(tokenizer_->Encode(text, ids));
  return ids;
}

StatusOr<std::string> TextCodec::Decode(std::span<const int32_t> ids) const {
  if (tokenizer_ != nullptr) return tokenizer_->Decode(ids);
  return BytesText(std::vector<int32_t>(ids.begin(), ids.end()));
}

Status TrainSentencePiece(const TokenizerTraining& o) {
  if (!o.output.ends_with(".model")) {
    return absl::InvalidArgumentError(StrCat(o.output,
                                             ": a SentencePiece model's name ends with "
                                             ".model (how data prepare knows it)"));
  }
  ZR_RETURN_IF_ERROR(CheckOutputPath(o.output, "data train-tokenizer"));  // before the training
  if (o.vocab_size < 32 || o.vocab_size > (1 << 20)) {
    return absl::InvalidArgumentError(StrCat("--vocab-size ", o.vocab_size, ": in [32, 2^20]"));
  }
  if (o.type != "bpe" && o.type != "unigram") {
    return absl::InvalidArgumentError(StrCat("--type ", o.type, ": bpe or unigram"));
  }
  std::string text;
  if (o.input.empty()) {
    text = DefaultCorpus();
  } else {
    ZR_ASSIGN_OR_RETURN(text, ReadDataFile(o.input, int64_t{1} << 30));
  }
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (end > at) lines.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (lines.empty()) return absl::InvalidArgumentError(StrCat(o.input, " holds no text"));
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::string serialized;
  const std::string e = spm::Train(lines,
                                   {{"vocab_size", std::to_string(o.vocab_size)},
                                    {"model_type", o.type},
                                    {"character_coverage", "1.0"},
                                    {"byte_fallback", "true"},
                                    {"split_digits", "true"},
                                    {"normalization_rule_name", "identity"},
                                    {"remove_extra_whitespaces", "false"},
                                    {"num_threads", std::to_string(threads)},
                                    {"minloglevel", "2"}},
                                   &serialized);
  if (!e.empty()) return absl::InvalidArgumentError(StrCat("SentencePiece training: ", e));
  return WriteFileAtomically(o.output, serialized, "data train-tokenizer");
}

}  // namespace zerort
