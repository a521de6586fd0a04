// [Note: zerort's tokenizers]
// Text to token ids and back. Tokenizer::Load reads a Hugging Face tokenizer.json of a byte-level
// BPE model (GPT-2, LLaMA-3, Qwen2, SmolLM and most current models):
//   - added_tokens: matched in the text first (the longest at the earliest position), never split
//     or normalised, each its id;
//   - normalizer: none or NFC (libutf8proc);
//   - pre_tokenizer: ByteLevel (with use_regex: GPT-2's pattern), Split with a Regex pattern and
//     behavior Isolated (LLaMA-3's, Qwen2's), or a Sequence of them; the patterns run in PCRE2
//     with Unicode properties (\p{L}, \p{N}, \s as Unicode defines them);
//   - model BPE: the byte-level alphabet (GPT-2's bytes_to_unicode), merges by rank (the lowest
//     first, leftmost first among equals), ignore_merges (a pre-token that is a whole vocabulary
//     entry is taken as it is: LLaMA-3);
//   - decoder ByteLevel.
// Anything else in the file (another model type, a normalizer or pre-tokenizer zerort does not
// implement, byte_fallback, a continuing_subword_prefix) is refused naming its JSON path, so a
// tokenizer never encodes differently from its reference in silence. Checked against Hugging
// Face's own JavaScript implementation (tests/engine/tokenizer_reference.mjs) on Unicode,
// whitespace runs, digits, contractions and special tokens: identical ids.
// Untrusted input: the bounded JSON reader (256 MiB), every id in range and unique, every merge
// of two known tokens, the patterns compiled with a match limit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace zerort {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Appends the ids of `text` (no BOS or EOS added). Thread-safe.
  virtual Status Encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The text of `ids` (an id outside the vocabulary is an error naming it).
  virtual StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;
  // Ids [0, vocab_size()), added tokens included.
  virtual int vocab_size() const = 0;
  // The id of an added (special) token, e.g. "<|endoftext|>".
  virtual std::optional<int32_t> AddedToken(std::string_view content) const = 0;
  // Whether a text cut after a line break that a non-space character follows encodes to the
  // whole text's ids (byte-level BPE: every pre-token starts there); not SentencePiece, which
  // adds its dummy prefix at the start of each call.
  virtual bool CutsAtLines() const { return true; }
  // The end-of-text token a corpus puts between documents: the first added token named like
  // one (<|endoftext|>, <|end_of_text|>, </s>, <eos>), if any.
  virtual std::optional<int32_t> EndOfText() const = 0;
};

// `zerort data train-tokenizer`: a SentencePiece model (BPE or unigram, byte fallback, digits
// split, identity normalisation, whitespace kept, unk 0, bos 1, eos 2: LLaMA's settings) trained
// on the lines of `input` (at most 1 GiB; empty:
// the built-in corpus), written to `output` (a .model file) through a .tmp renamed at the end.
struct TokenizerTraining {
  std::string input;
  std::string output;
  int vocab_size = 512;
  std::string type = "bpe";  // or "unigram"
  int threads = 0;           // 0: every core
};
Status TrainSentencePiece(const TokenizerTraining& options);

// The text side of a run (its sample's prompt and output): data.tokenizer's tokenizer, or byte
// tokens (vocabulary 256) when there is none.
class TextCodec {
 public:
  // `tokenizer` a tokenizer.json or empty; its vocabulary must fit `vocab_size`.
  static StatusOr<TextCodec> For(const std::string& tokenizer, int vocab_size);
  StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // Byte tokens' non-printable bytes escaped; a tokenizer's text as it decodes.
  StatusOr<std::string> Decode(std::span<const int32_t> ids) const;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace zerort
